"""A new user's first run: "I have a LeRobot dataset at PATH" to an exported policy that answers
on one of its raw frames, with the shipped real-robot example config and without the demo."""

from __future__ import annotations

import sys
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from robot_data import CAMERAS, write_arm_dataset  # noqa: E402

from raytrain_vla import policy, run  # noqa: E402
from raytrain_vla.config import data_root  # noqa: E402
from raytrain_vla.data.formats.lerobot import LeRobotMeta  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "so100_pick_place.yaml"


def first_frame(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def test_a_robot_dataset_trains_with_the_example_config_and_its_policy_answers_a_raw_frame(
    tmp_path, monkeypatch, capsys
):
    root = write_arm_dataset(tmp_path / "my_so100")  # 480x640 top, 240x320 wrist, 6-DoF
    monkeypatch.setattr(data_root, "DEMO_CACHE", tmp_path / "demo_cache")
    storage = tmp_path / "runs"
    args = [
        f"--config={EXAMPLE}",
        f"--data.root={root}",
        # The cluster parts of the example, for this machine: 2 CPU workers, fp32, 3 steps.
        "--ray.use_gpu=false",
        "--ray.num_workers=2",
        "--ray.resources_per_worker={CPU: 1}",
        f"--ray.storage_path={storage}",
        "--train.precision=fp32",
        "--train.steps=3",
        "--train.global_batch_size=8",
        "--train.micro_batch_size=4",
        "--train.val_interval=3",
        "--train.save_interval=3",
        "--scheduler.warmup_steps=1",
        "--data.val_fraction=0.2",
        "--logging.wandb_mode=disabled",
        "--logging.console=false",
    ]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    assert "note: the model sees each camera at 120x160: 300 vision tokens per camera" in out
    run_dir = storage / "so100_pick_place"
    loaded = policy.load(run_dir / "export")
    assert loaded.camera_keys == list(CAMERAS) and loaded.action_dim == 6

    meta = LeRobotMeta.load(root)
    state = pq.read_table(next((root / "data").rglob("*.parquet")))["observation.state"]
    observation = {key: first_frame(meta.video_file(key, 0)) for key in CAMERAS}
    assert observation["observation.images.top"].shape == (480, 640, 3)
    assert observation["observation.images.wrist"].shape == (240, 320, 3)
    observation["observation.state"] = np.asarray(state[0].as_py(), np.float32)
    observation["task"] = meta.tasks[0]
    chunk = loaded.predict_action_chunk(observation)
    assert chunk.shape == (50, 6) and np.isfinite(chunk).all()
    assert not (tmp_path / "demo_cache").exists()  # the demo was never written
