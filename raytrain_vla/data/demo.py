"""Write the demo task (the reaching simulator's expert) as a LeRobot v3.0 dataset, and write it
where a run expects its data when that is missing and allowed.

The simulator supplies the content; `writer.write_lerobot_dataset` supplies LeRobot's layout and
the atomic, never-overwrite write. The demo keeps near-lossless h264 (crf 10): its 32px frames
and thin disc edges would blur at LeRobot's default AV1 crf 30.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.formats.lerobot import DatasetError
from raytrain_vla.data.formats.video import DEFAULT_CODEC, DEFAULT_CRF, DEFAULT_GOP, DEFAULT_PRESET
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)
from raytrain_vla.sim import simulator as sim
from raytrain_vla.sim.simulator import DEMO_ROBOT_TYPE, IMAGE_KEY

DEMO_VIDEO = VideoSpec(DEFAULT_CODEC, DEFAULT_CRF, DEFAULT_GOP, DEFAULT_PRESET)


def write_demo_dataset(
    root: str | os.PathLike, num_episodes: int, seed: int = 0, image_size: int = 32
) -> Path:
    """Roll out `num_episodes` expert episodes and write them as a LeRobot v3.0 dataset at `root`."""
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} already exists and is not empty; refusing to overwrite it")
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    rng = np.random.default_rng(seed)
    episodes = [
        EpisodeData({IMAGE_KEY: e.images}, e.states, e.actions, e.scene.instruction)
        for e in (sim.rollout_expert(rng, image_size) for _ in range(num_episodes))
    ]
    spec = DatasetSpec(
        sim.FPS, DEMO_VIDEO, robot_type=DEMO_ROBOT_TYPE, state_names=["x", "y"],
        action_names=["x", "y"],
    )  # fmt: skip
    return write_lerobot_dataset(root, episodes, spec)


def ensure_dataset(cfg: DataConfig) -> Path:
    """The dataset root, writing the demo dataset first when it is missing and allowed."""
    root = Path(cfg.root).expanduser()
    if (root / "meta" / "info.json").is_file():
        return root
    if not cfg.write_demo_if_missing:
        raise DatasetError(f"{root}: no LeRobot dataset here (missing meta/info.json)")
    return write_demo_dataset(root, cfg.demo_episodes, cfg.demo_seed)
