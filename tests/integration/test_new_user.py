"""A new user's first run, by the README's own commands: "I have a LeRobot dataset at PATH" to
an exported policy that answers on one of its raw frames, with the shipped real-robot example
config and without the demo dataset."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from robot_data import CAMERAS, write_arm_dataset  # noqa: E402

from raytrain_vla import cli, policy  # noqa: E402
from raytrain_vla.config import data_root  # noqa: E402
from raytrain_vla.data.formats.lerobot import LeRobotMeta  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")
REPO = Path(__file__).resolve().parents[2]
README_PATH = "/data/my_so100"  # the path the README's commands name
# What 2 CPU cores cannot do of the README's run: its length, batch and model size.
SHORT = [
    "--model.flow_vla.size=tiny",
    "--data.val_max_samples=16",
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


def readme_commands() -> list[list[str]]:
    """The `raytrain-vla` commands of the README's "Your own robot's dataset" block."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Your own robot's dataset") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line]


def first_frame(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def test_the_readme_commands_train_on_a_robot_dataset_and_its_policy_answers_a_raw_frame(
    tmp_path, monkeypatch, capsys
):
    root = write_arm_dataset(tmp_path / "my_so100", lengths=(60, 45, 20, 70, 52, 64))
    monkeypatch.setattr(data_root, "DEMO_CACHE", tmp_path / "demo_cache")
    monkeypatch.chdir(tmp_path)  # `--ray.storage_path=runs` lands here
    (tmp_path / "examples").symlink_to(REPO / "examples")
    preflight, train = readme_commands()
    assert preflight[:3] == ["raytrain-vla", "data", "preflight"] and train[:2] == [
        "raytrain-vla",
        "train",
    ]

    def as_here(words: list[str]) -> list[str]:
        return [w.replace(README_PATH, str(root)) for w in words[1:]]

    assert cli.main(as_here(preflight)) == 0
    out = capsys.readouterr().out
    assert "0 error(s)" in out and "120x160: 300 vision tokens per camera" in out
    assert "2 of 6 episodes are shorter than data.chunk_size 50" in out

    assert cli.main([*as_here(train), *SHORT]) == 0
    run_dir = tmp_path / "runs" / "so100_pick_place"
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
