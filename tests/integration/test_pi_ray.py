"""pi0 and pi0.5 (LeRobot's tiny checkpoints) fine-tuned on the demo data on Ray: 2 workers,
FSDP2 over the joint layers. A killed worker costs nothing (bitwise), and the LeRobot-format
export, read back here, predicts exactly what our export predicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _runs import short_run_args
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _paths import fixtures_root  # noqa: E402

from raytrain_vla import export, policy, run  # noqa: E402
from raytrain_vla.train.checkpoint import stored_model_keys  # noqa: E402
from raytrain_vla.train.resume import latest_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 6


def pi_args(variant: str, demo_root: Path, storage: Path, name: str, *extra: str) -> list[str]:
    pretrained = fixtures_root() / f"lerobot_{variant}_tiny" / "pretrained_model"
    return short_run_args(
        demo_root, storage, name, STEPS, "--debug.log_sample_ids=true", f"--model.type={variant}",
        f"--model.init_from={pretrained}", f"--model.{variant}.vision_heads=2",
        f"--model.{variant}.cameras={{observation.images.base_0_rgb: observation.image}}",
        f"--model.{variant}.train_expert_only=true", *extra,
    )  # fmt: skip


def committed_ids(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["rank"]): r["ids"] for r in rows}


# The kill is done on pi0.5 only, for suite time: resuming is the trainer's and both variants
# shard the same joint Gemma layers. Each variant still trains on Ray, keeps its VLM as
# LeRobot's, and exports to LeRobot's format exactly.
@pytest.mark.parametrize("variant, killed_too", [("pi0", False), ("pi05", True)])
def test_a_killed_worker_resumes_bitwise_and_the_lerobot_export_predicts_the_same(
    variant, killed_too, demo_root, tmp_path
):
    assert run.main(pi_args(variant, demo_root, tmp_path, "reference")) == 0
    reference = tmp_path / "reference"
    ours = load_file(str(reference / "export" / "model.safetensors"))
    if killed_too:
        args = pi_args(variant, demo_root, tmp_path, "killed", "--ray.max_failures=1")
        assert run.main([*args, "--debug.kill_at_step=4", "--debug.kill_rank=1"]) == 0
        killed = tmp_path / "killed"
        assert (killed / ".fault_kill_4").exists()
        assert committed_ids(killed) == committed_ids(reference)
        resumed = load_file(str(killed / "export" / "model.safetensors"))
        assert resumed.keys() == ours.keys()
        for key in ours:
            np.testing.assert_array_equal(resumed[key], ours[key], err_msg=key)
    # train_expert_only: checkpoints hold the expert stream only; the VLM stays LeRobot's.
    stored = stored_model_keys(latest_checkpoint(reference))
    assert stored and not any(
        ".vlm." in k or k.startswith(("vision.", "embed_tokens.")) for k in stored
    )
    start = policy.load(
        fixtures_root() / f"lerobot_{variant}_tiny" / "pretrained_model",
        options={"vision_heads": 2},
    ).model.state_dict()
    moved = [k for k in stored if not np.array_equal(ours[k], start[k].numpy())]
    assert moved, "nothing trained"
    for name in set(ours) - stored:
        np.testing.assert_array_equal(ours[name], start[name].numpy(), err_msg=name)

    out = tmp_path / "pretrained_model"
    assert export.main([str(latest_checkpoint(reference)), str(out), "--format", "lerobot"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["type"] == variant and len(load_file(str(out / "model.safetensors"))) == len(ours)
    exported, lerobot = (
        policy.load(reference / "export"),
        policy.load(out, options={"vision_heads": 2}),
    )
    images = np.random.default_rng(0).integers(0, 255, (2, 3, 32, 32), dtype=np.uint8)
    batch = {
        "observation.image": torch.from_numpy(images).float() / 255,
        "observation.state": torch.tensor([[0.2, 0.5], [0.7, 0.1]]),
        "task": ["push the red block to the left zone", "push the blue block to the right zone"],
    }
    noise = torch.randn(
        (2, *exported.model.noise_shape), generator=torch.Generator().manual_seed(0)
    )
    expected = exported.predict_action_chunk(batch, noise=noise)
    assert expected.shape == (2, exported.model.config.chunk_size, 2)
    assert torch.equal(lerobot.predict_action_chunk(batch, noise=noise), expected)
