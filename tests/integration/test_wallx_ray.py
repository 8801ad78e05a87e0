"""Wall-OSS (LeRobot's tiny `wall_x` checkpoint) fine-tuned on the demo data on Ray: 2 workers,
FSDP2 over the vision blocks, the embedding and the decoder layers (each with both experts).
The LeRobot-format export is read back exactly, and LeRobot itself loads it when its venv is
here (`benchmarks/lerobot_crosscheck.py`)."""

from __future__ import annotations

import json
import os
import subprocess
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
from raytrain_vla.train.resume import latest_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 4
CAMERAS = "{observation.images.face_view: observation.image}"  # the wrist view is left out
LEROBOT_PYTHON = os.environ.get("RAYTRAIN_VLA_LEROBOT_PYTHON", "/tmp/lrv/bin/python")


def test_a_two_worker_fine_tune_exports_to_lerobot_s_format(demo_root, tmp_path):
    pretrained = fixtures_root() / "lerobot_wallx_tiny" / "pretrained_model"
    args = short_run_args(
        demo_root, tmp_path, "wallx", STEPS, "--model.type=wall_x",
        f"--model.init_from={pretrained}", f"--model.wall_x.cameras={CAMERAS}",
        "--data.chunk_size=8",
    )  # fmt: skip
    assert run.main(args) == 0
    ours = load_file(str(tmp_path / "wallx" / "export" / "model.safetensors"))
    start = policy.load(pretrained).model.state_dict()
    moved = [k for k in ours if not np.array_equal(ours[k], start[k].numpy())]
    assert len(moved) > len(ours) // 2, "most weights should have trained"

    out = tmp_path / "pretrained_model"
    assert (
        export.main([str(latest_checkpoint(tmp_path / "wallx")), str(out), "--format", "lerobot"])
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert config["type"] == "wall_x" and config["pretrained_name_or_path"] == str(out / "base")
    exported, lerobot = policy.load(tmp_path / "wallx" / "export"), policy.load(out)
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
    assert expected.shape == (2, 8, 2)
    # LeRobot's files hold bf16 weights (its dtypes): the read-back runs those, within bf16.
    torch.testing.assert_close(
        lerobot.predict_action_chunk(batch, noise=noise), expected, atol=0.05, rtol=0.05
    )
    if Path(LEROBOT_PYTHON).is_file():  # LeRobot with its wallx extra: it loads the export
        check = subprocess.run(
            [sys.executable, "benchmarks/lerobot_crosscheck.py", str(out),
             "--lerobot-python", LEROBOT_PYTHON],
            capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        result = json.loads(check.stdout)
        assert result["max_abs_diff"] < 0.05, result
