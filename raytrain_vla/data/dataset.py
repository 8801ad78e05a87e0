"""A dataset as the trainer sees it: train/val split, sample plan, normaliser, fingerprint, and
the sample source (LeRobot files or precomputed shards) that Ray Data read tasks carry.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raytrain_vla.common.location import as_path, is_remote
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.object_cache import CacheConfig
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.formats.lerobot import (
    ACTION,
    STATE,
    DatasetError,
    LeRobotMeta,
    dataset_fingerprint,
)
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.shards.manifest import MANIFEST
from raytrain_vla.data.formats.shards.reader import ShardSource
from raytrain_vla.data.plan import SamplePlan
from raytrain_vla.data.stats import clipped_action_stats


def root_fingerprint(root: str | Path) -> str:
    """The fingerprint a run records for `data.root`; shards report their source dataset's."""
    root = as_path(root)
    manifest = root / MANIFEST
    if manifest.is_file():
        return str(json.loads(manifest.read_text())["source_fingerprint"])
    return dataset_fingerprint(LeRobotMeta.load(root))


def split_episodes(num_episodes: int, val_fraction: float, val_episodes: list[int]) -> np.ndarray:
    """Held-out episode ids: the explicit list, else a fixed seeded choice of the fraction."""
    if val_episodes:
        bad = [e for e in val_episodes if not 0 <= e < num_episodes]
        if bad:
            raise DatasetError(
                f"data.val_episodes {bad} are not episodes of this dataset (0..{num_episodes - 1})"
            )
        return np.unique(np.asarray(val_episodes, dtype=np.int64))
    n_val = int(round(num_episodes * val_fraction))
    if val_fraction > 0:
        n_val = min(max(n_val, 1), num_episodes - 1)
    # Seeded by the dataset size only, so the held-out set does not move with the training seed.
    return np.sort(np.random.default_rng([0x5E1, num_episodes]).permutation(num_episodes)[:n_val])


def ids_in_runs(first: np.ndarray, length: np.ndarray, at_most: int) -> np.ndarray:
    """The ids of the runs, in order, thinned evenly to `at_most` when there are more."""
    length = np.asarray(length, np.int64)
    total = int(length.sum())
    pos = np.arange(total) if total <= at_most else np.linspace(0, total - 1, at_most)
    pos = pos.astype(np.int64)
    ends = np.cumsum(length)
    run = np.searchsorted(ends, pos, side="right")
    return np.asarray(first, np.int64)[run] + pos - (ends[run] - length[run])


@dataclass
class DatasetView:
    meta: LeRobotMeta
    source: LeRobotSource | ShardSource
    plan: SamplePlan
    val_ids: np.ndarray
    normalizer: Normalizer
    fingerprint: str
    spec: DataSpec

    @classmethod
    def open(cls, cfg: DataConfig, seed: int, global_batch_size: int) -> DatasetView:
        root = as_path(cfg.root)
        meta = LeRobotMeta.load(root)
        if cfg.action_clip:  # everything below sees the statistics of what it trains on
            if (root / MANIFEST).is_file():
                raise DatasetError(
                    f"{root}: 'data.action_clip' computes the clipped actions' statistics from "
                    "a LeRobot dataset's frames, and shards hold samples; train on the LeRobot "
                    "root, or leave action_clip empty"
                )
            low, high = cfg.action_clip
            clipped = clipped_action_stats(meta, low, high)
            meta = dataclasses.replace(meta, stats={**meta.stats, ACTION: clipped})
        if (root / MANIFEST).is_file():  # precomputed shards (formats/shards.py), same samples
            source: LeRobotSource | ShardSource = ShardSource(root, cfg.chunk_size)
        else:
            source = LeRobotSource(meta, cfg.chunk_size)
            if is_remote(root):
                source.cache = CacheConfig.from_gb(cfg.cache_dir, cfg.cache_max_gb)
        val_eps = split_episodes(meta.num_episodes, cfg.val_fraction, cfg.val_episodes)
        is_val = np.isin(np.arange(meta.num_episodes), val_eps)
        first, length = meta.episode_from_index.astype(np.int64), meta.episode_length
        # Runs of whole training episodes: the plan stays O(episodes), never O(frames).
        plan = SamplePlan.from_runs(
            first[~is_val], length[~is_val], seed, global_batch_size, cfg.span_len,
            cfg.shuffle_window,
        )  # fmt: skip
        val_ids = ids_in_runs(first[is_val], length[is_val], cfg.val_max_samples)
        normalizer = Normalizer.from_stats(
            meta.stats,
            cfg.normalization,
            cfg.normalization_per_feature,
            source=str(meta.root / "meta" / "stats.json"),
            keep_stats=(*source.camera_keys, STATE, ACTION),
            dims={STATE: meta.state_dim, ACTION: meta.action_dim},
        )
        # Shards carry their source's fingerprint: same samples, so a run may switch formats.
        fingerprint = getattr(source, "fingerprint", None) or dataset_fingerprint(meta)
        spec = DataSpec(
            camera_shapes={k: meta.camera_shape(k) for k in source.camera_keys},
            state_dim=meta.state_dim,
            action_dim=meta.action_dim,
            chunk_size=cfg.chunk_size,
            image_size=tuple(cfg.image_size) if cfg.image_size else None,
        )
        return cls(meta, source, plan, val_ids, normalizer, fingerprint, spec)

    @property
    def tasks(self) -> list[str]:
        return list(self.meta.tasks)

    @property
    def mean_action(self) -> np.ndarray:
        return np.asarray(self.meta.stats[ACTION]["mean"], dtype=np.float32)
