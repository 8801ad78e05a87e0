"""`raytrain_vla.run` end to end on the shared local cluster: checkpoint, resume, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from raytrain_vla import policy, run
from raytrain_vla.models.registry import get_family
from raytrain_vla.sim.simulator import ReachEnv

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _records(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("checkpoint_*") if p.is_dir())


def test_metrics_fields_and_nan_guard_on_ray(run_args, tmp_path):
    nan = ["--debug.nan_loss_step=1", "--debug.nan_loss_rank=1"]
    assert run.main(run_args("metrics", 3, "--train.val_interval=3", *nan)) == 0
    records = _records(tmp_path / "runs" / "metrics")
    assert [r["nonfinite_losses_zeroed"] for r in records] == [0.0, 1.0, 0.0]
    assert [r["update_skipped"] for r in records] == [0.0, 0.0, 0.0]
    record = records[-1]
    for key in ("loss", "grad_norm", "samples_per_s", "data_wait_share", "step_time_s"):
        assert np.isfinite(record[key]), key
    assert {"lr/vision", "lr/backbone", "lr/action_expert", "grad_norm/vision"} <= record.keys()
    val = _records(tmp_path / "runs" / "metrics", "val")[-1]
    assert val["val_action_mse"] > 0 and val["val_mean_action_mse"] > 0


FAMILY = get_family("flow_vla")
DEMO_MODEL_CONFIG = FAMILY.config_type.from_size("tiny")  # the demo's shapes are the defaults


def test_resumed_fine_tune_matches_a_straight_run_and_checkpoints_hold_only_what_trains(
    run_args, tmp_path
):
    """Fine-tune the action expert from a pretrained file, stop at step 6, rerun the same name
    to step 9, and compare with a straight 9-step run: the resume starts at step 7, reads every
    global batch once in the same order and ends bitwise equal. Checkpoints hold only what
    trains; resume and export restore the rest from the init source. Observability (wandb,
    closed-loop episodes) rides along on the interrupted run only, so it provably leaves the
    training untouched."""
    from safetensors.torch import save_file

    from raytrain_vla import export
    from raytrain_vla.train.checkpoint import stored_model_keys
    from raytrain_vla.train.init_source import build_init_source

    pretrained = tmp_path / "pretrained.safetensors"
    weights = build_init_source(FAMILY, DEMO_MODEL_CONFIG, seed=7).state_dict()
    save_file(weights, str(pretrained))
    extra = [
        "--optimizer.train_action_expert_only=true",
        f"--model.init_from={pretrained}",
        "--debug.log_sample_ids=true",
    ]
    observed = [
        *extra,
        "--logging.wandb_mode=offline",
        "--train.val_interval=3",
        "--eval.episodes=2",
        "--eval.rollouts_logged=1",
        "--eval.at_validation=true",
    ]
    runs = tmp_path / "runs"
    assert run.main(run_args("head", 6, *observed)) == 0
    ckpt = _checkpoints(runs / "head")[-1]
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    layout = {".metadata", "__0_0.distcp", "__1_0.distcp", "train_state.json", "scheduler.json"}
    layout |= {"config.yaml", "normalization.json", "policy.json", "rng/rank0.pt", "rng/rank1.pt"}
    assert layout <= names
    state = json.loads((ckpt / "train_state.json").read_text())
    assert state["step"] == 6 and state["world_size"] == 2
    stored = stored_model_keys(ckpt)
    trained = {k for k in weights if FAMILY.model_type.role_of(k) == "action_expert"}
    assert stored == trained, sorted(stored)[:5]
    assert state["frozen_params"] == len(weights) - len(stored)

    assert run.main(run_args("head", 9, *observed)) == 0
    assert [r["step"] for r in _records(runs / "head")] == list(range(1, 10))
    assert run.main(run_args("head_straight", 9, *extra)) == 0

    def ids(run_dir: Path) -> dict[tuple[int, int], list[int]]:
        rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
        return {(r["step"], r["rank"]): r["ids"] for r in rows}

    assert ids(runs / "head") == ids(runs / "head_straight")
    assert sorted({s for s, _ in ids(runs / "head")}) == list(range(9))
    resumed = load_file(str(runs / "head" / "export" / "model.safetensors"))
    straight = load_file(str(runs / "head_straight" / "export" / "model.safetensors"))
    for key, value in straight.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
        if key not in stored:  # frozen: still the pretrained values
            np.testing.assert_array_equal(value, weights[key].numpy(), err_msg=key)
    assert any(not np.array_equal(straight[k], weights[k].numpy()) for k in stored)

    # The export loads without Ray, predicts in the robot's units, and names a bad observation.
    loaded = policy.load(runs / "head" / "export")
    obs = ReachEnv(seed=1).reset()
    assert loaded.predict_action({"observation.image": obs["image"], **obs}).shape == (8, 2)
    with pytest.raises(ValueError, match="state"):
        loaded.predict_action(
            {"observation.image": obs["image"], "state": [0.0], "instruction": ""}
        )

    # The export CLI restores the left-out parameters from the init source...
    out = tmp_path / "from_checkpoint"
    assert export.main([str(_checkpoints(runs / "head")[-1]), str(out)]) == 0
    exported = load_file(str(out / "model.safetensors"))
    for key, value in resumed.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    # ...and refuses an init source that no longer holds the values trained with.
    save_file(build_init_source(FAMILY, DEMO_MODEL_CONFIG, seed=8).state_dict(), str(pretrained))
    assert export.main([str(_checkpoints(runs / "head")[-1]), str(tmp_path / "bad")]) == 1
    assert not (tmp_path / "bad").exists()

    # Both attempts logged into one wandb run: same id, so `wandb sync` continues one run.
    head = runs / "head"
    attempts = sorted(p.name for p in (head / "wandb").glob("offline-run-*"))
    run_ids = {name.split("-", 3)[-1] for name in attempts}  # offline-run-DATE_TIME-ID
    assert len(attempts) == 2 and len(run_ids) == 1 and run_ids.pop().startswith("head-"), attempts
    tables = list((head / "wandb").glob("offline-run-*/files/media/table/**/*.table.json"))
    assert tables, "no rollouts table in the wandb run"
    # Closed-loop scores at every validation, and with baselines and rollouts at the end.
    val = _records(head, "val")
    assert [r["step"] for r in val] == [3, 6, 9]
    assert all(0.0 <= r["eval_success_rate"] <= 1.0 for r in val)
    final = _records(head, "eval")[-1]
    assert final["step"] == 9
    assert {"policy_success_rate", "random_success_rate", "instruction_blind_success_rate"} <= (
        final.keys()
    )
    assert {p.name for p in (head / "rollouts").glob("step000009_*")} == {
        "step000009_policy_0.png",
        "step000009_policy_0.mp4",
    }
