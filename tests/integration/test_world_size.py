"""The sample order is a function of the plan, not of the number of workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain_vla import run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _global_batches(run_dir: Path) -> dict[int, list[int]]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    out: dict[int, list[int]] = {}
    for row in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        out.setdefault(row["step"], []).extend(row["ids"])
    return out


def test_one_and_two_workers_read_the_same_global_batches_and_export_alike(run_args, tmp_path):
    debug = "--debug.log_sample_ids=true"
    assert run.main(run_args("w2", 5, debug, "--ray.num_workers=2")) == 0
    # One worker keeps the global batch of 16 with two accumulation steps of 8.
    assert run.main(run_args("w1", 5, debug, "--ray.num_workers=1")) == 0
    w1, w2 = _global_batches(tmp_path / "runs" / "w1"), _global_batches(tmp_path / "runs" / "w2")
    assert sorted(w1) == list(range(5))
    assert w1 == w2
    rows = [
        json.loads(line)
        for line in (tmp_path / "runs" / "w1" / "samples.jsonl").read_text().splitlines()
    ]
    assert {r["world_size"] for r in rows} == {1} and all(len(r["ids"]) == 16 for r in rows)
    _export_cli_turns_checkpoints_of_any_world_size_into_the_same_policy(run_args, tmp_path)


def _export_cli_turns_checkpoints_of_any_world_size_into_the_same_policy(run_args, tmp_path):
    """On the W=1 and W=2 runs above: export from the last checkpoint equals the run's own
    export (bitwise), and the loaded policy predicts what the exported weights predict."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from safetensors.torch import load_file as load_torch

    from raytrain_vla import export, policy
    from raytrain_vla.train.resume import latest_checkpoint

    for workers in (1, 2):
        name = f"w{workers}"
        run_dir = tmp_path / "runs" / name
        out = tmp_path / f"policy{workers}"
        assert export.main([str(latest_checkpoint(run_dir)), str(out)]) == 0
        ours, theirs = (
            load_file(str(out / "model.safetensors")),
            load_file(str(run_dir / "export" / "model.safetensors")),
        )
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
        obs = {
            "observation.image": np.zeros((32, 32, 3), np.uint8),
            "state": np.zeros(2, np.float32),
            "instruction": "reach the red disc",
        }
        a = policy.load(out, seed=3).predict_action(obs)
        b = policy.load(run_dir / "export", seed=3).predict_action(obs)
        np.testing.assert_allclose(a, b, atol=1e-5)
        half = tmp_path / f"policy{workers}_bf16"
        assert export.main([str(latest_checkpoint(run_dir)), str(half), "--dtype", "bf16"]) == 0
        halves = load_torch(str(half / "model.safetensors"))
        assert all(v.dtype == torch.bfloat16 for v in halves.values() if v.is_floating_point())
    # Fine-tuning from that export at LR 0 through the whole run path leaves the weights as
    # loaded: the workers really start from the policy (`model.init_from`). The vision role is
    # frozen by name: its parameters stay out of the checkpoint and come back from the policy.
    # The run is HSDP (2 replicas of one shard each) in bf16, its frozen weights replicated in
    # bf16: the export still holds them bitwise as the policy does (taken from the source).
    zero = tmp_path / "zero_lr.yaml"
    groups = "".join(
        f"    - {{name: {g}, patterns: ['^{g}\\.'], lr: 0.0, weight_decay: 0.0}}\n"
        for g in ("vision", "backbone", "action_expert")
    )
    zero.write_text(f"optimizer:\n  lr: 0.0\n  groups:\n{groups}")
    tuned_args = run_args(
        "tuned", 2, f"--model.init_from={run_dir / 'export'}", "--optimizer.freeze_roles=[vision]",
        "--train.dp_shard=1", "--train.frozen_params=replicate", "--train.precision=bf16",
    )  # fmt: skip
    assert run.main(["--config", str(zero), *tuned_args]) == 0
    from raytrain_vla.models.registry import get_family
    from raytrain_vla.train.checkpoint import stored_model_keys

    role_of = get_family("flow_vla").model_type.role_of
    stored = stored_model_keys(latest_checkpoint(tmp_path / "runs" / "tuned"))
    assert stored and {role_of(k) for k in stored} == {"backbone", "action_expert"}
    tuned = load_file(str(tmp_path / "runs" / "tuned" / "export" / "model.safetensors"))
    lines = (tmp_path / "runs" / "tuned" / "metrics.jsonl").read_text().splitlines()
    train_rows = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    # A shard group of one gathers and reduce-scatters nothing; HSDP all-reduces the gradients.
    assert train_rows and all(
        r["comm/allgather_bytes"] == r["comm/reduce_scatter_bytes"] == 0
        and r["comm/allreduce_bytes"] > 0
        for r in train_rows
    )
    for key, value in load_file(str(run_dir / "export" / "model.safetensors")).items():
        np.testing.assert_array_equal(tuned[key], value, err_msg=key)
    # The report renders both figures for a finished run.
    from raytrain_vla import report

    assert report.main([str(run_dir)]) == 0
    for name in ("training.png", "predictions.png"):
        assert (run_dir / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_export_cli_refuses_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    from raytrain_vla import export

    assert export.main([str(tmp_path), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a raytrain_vla training checkpoint" in err[0]
    assert not (tmp_path / "out").exists()
