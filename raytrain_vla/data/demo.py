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

import raytrain_vla.config.data_root as locate
from raytrain_vla.common.location import as_path
from raytrain_vla.common.uri import is_uri
from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.formats.lerobot import DatasetError
from raytrain_vla.data.formats.video import DEFAULT_CODEC, DEFAULT_CRF, DEFAULT_GOP, DEFAULT_PRESET
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)
from raytrain_vla.progress import progress
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
    rollouts = progress(range(num_episodes), f"demo episodes -> {root}", "ep")
    episodes = [
        EpisodeData({IMAGE_KEY: e.images}, e.states, e.actions, e.scene.instruction)
        for e in (sim.rollout_expert(rng, image_size) for _ in rollouts)
    ]
    spec = DatasetSpec(
        sim.FPS, DEMO_VIDEO, robot_type=DEMO_ROBOT_TYPE, state_names=["x", "y"],
        action_names=["x", "y"],
    )  # fmt: skip
    return write_lerobot_dataset(root, episodes, spec)


def ensure_dataset(cfg: DataConfig) -> Path:
    """The dataset root (resolved by `config.absolute_paths`). The demo dataset is written only
    when asked for: `data.root=demo`, or `data.write_demo_if_missing=true`; any other missing
    path is a ConfigError that names it and the closest path that exists."""
    if is_uri(cfg.root):  # object storage: read in place, never written here
        remote = as_path(cfg.root)
        if locate.is_dataset(remote):
            return remote
        raise ConfigError(
            f"'data.root' {cfg.root!r}: no meta/info.json or shards.json there (check the URI "
            "and the AWS_* credentials and endpoint)"
        )
    root = Path(cfg.root).expanduser()
    if locate.is_dataset(root):
        return root
    if cfg.repo_id:
        raise ConfigError(
            f"'data.repo_id' {cfg.repo_id!r}: not in the local LeRobot cache; looked in {root} "
            f"(HF_LEROBOT_HOME={locate.lerobot_home()}). Download it first, e.g. "
            f"`huggingface-cli download --repo-type dataset {cfg.repo_id} --local-dir {root}`"
        )
    if root.resolve() == locate.demo_root(cfg.demo_episodes, cfg.demo_seed) or (
        cfg.write_demo_if_missing
    ):
        return write_demo_dataset(root, cfg.demo_episodes, cfg.demo_seed)
    if root.exists():
        raise DatasetError(
            f"{root}: not a dataset (no meta/info.json of a LeRobot dataset, no shards.json)"
        )
    raise ConfigError(
        f"'data.root' {str(root)!r} does not exist (closest existing: "
        f"{locate.nearest_existing(root)}); the demo dataset is written only for data.root=demo"
    )
