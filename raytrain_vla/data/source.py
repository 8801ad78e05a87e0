"""A LeRobot dataset as the trainer sees it: train/val split, sample plan, and a sample reader.

`LeRobotSource` is what Ray Data read tasks carry: the low-dimensional columns as small numpy
arrays plus video paths, so a task decodes only the frames of its own samples. Image features
stored inside parquet are read per task too, from the row groups that hold those samples.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.images import ImageRows
from raytrain_vla.data.lerobot import (
    DatasetError,
    LeRobotMeta,
    column_to_numpy,
    describe_episodes,
    read_frames_table,
)
from raytrain_vla.data.plan import SamplePlan
from raytrain_vla.data.transforms import BatchTransform, Normalizer
from raytrain_vla.data.video import VideoDecodeError, decode_frames

STATE, ACTION = "observation.state", "action"


def ensure_dataset(cfg: DataConfig) -> Path:
    """The dataset root, writing the demo dataset first when it is missing and allowed."""
    root = Path(cfg.root).expanduser()
    if (root / "meta" / "info.json").is_file():
        return root
    if not cfg.write_demo_if_missing:
        raise DatasetError(f"{root}: no LeRobot dataset here (missing meta/info.json)")
    return write_demo_dataset(root, cfg.demo_episodes, cfg.demo_seed)


def dataset_fingerprint(meta: LeRobotMeta) -> str:
    """Content hash of `meta/` plus the size of every data and video file."""
    h = hashlib.sha256()
    for path in sorted((meta.root / "meta").rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(meta.root)).encode())
            h.update(path.read_bytes())
    for sub in ("data", "videos"):
        for path in sorted((meta.root / sub).rglob("*")):
            if path.is_file():
                h.update(f"{path.relative_to(meta.root)}:{path.stat().st_size}".encode())
    return h.hexdigest()[:16]


def root_fingerprint(root: str | Path) -> str:
    """The fingerprint a run records for `data.root`; shards report their source dataset's."""
    root = Path(root)
    manifest = root / "shards.json"
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


class LeRobotSource:
    """Reads samples (frame index + its action chunk) by global frame index."""

    def __init__(self, meta: LeRobotMeta, chunk_size: int):
        missing = [k for k in (STATE, ACTION) if k not in meta.features]
        if missing:
            raise DatasetError(
                f"{meta.root / 'meta' / 'info.json'}: features {missing} are required"
            )
        table = read_frames_table(meta, ["episode_index", "timestamp", "task_index", STATE, ACTION])
        self.chunk_size = chunk_size
        self.state = column_to_numpy(table, STATE).astype(np.float32)
        self.action = column_to_numpy(table, ACTION).astype(np.float32)
        self.episode_of = column_to_numpy(table, "episode_index").astype(np.int64)
        self.task_index = column_to_numpy(table, "task_index").astype(np.int64)
        timestamp = column_to_numpy(table, "timestamp").astype(np.float64)
        self.episode_end = meta.episode_to_index[self.episode_of].astype(np.int64)
        self.camera_keys = meta.camera_keys  # video and image features, in info.json order
        self.image_rows = ImageRows(meta) if meta.image_keys else None
        self.video_paths: dict[str, list[str]] = {}
        self.video_file_of: dict[str, np.ndarray] = {}
        self.video_time: dict[str, np.ndarray] = {}
        for key in meta.video_keys:
            files = [str(meta.video_file(key, e)) for e in range(meta.num_episodes)]
            paths = sorted(set(files))
            path_id = {f: i for i, f in enumerate(paths)}
            file_id = np.array([path_id[f] for f in files], dtype=np.int64)
            offset = np.array([meta.video_from_timestamp(key, e) for e in range(meta.num_episodes)])
            self.video_paths[key] = paths
            self.video_file_of[key] = file_id[self.episode_of]
            self.video_time[key] = offset[self.episode_of] + timestamp

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(sample_ids, dtype=np.int64)
        steps = ids[:, None] + np.arange(self.chunk_size)[None]
        end = self.episode_end[ids][:, None]
        out = {
            "sample_id": ids,
            "state": self.state[ids],
            "actions": self.action[
                np.minimum(steps, end - 1)
            ],  # edge action repeated, like LeRobot
            "action_is_pad": steps >= end,
            "task_index": self.task_index[ids],
        }
        for key in self.camera_keys:
            if key not in self.video_paths:  # an image feature stored inside parquet
                imgs = self.image_rows.read(key, ids, self.episode_of[ids])
                out[f"image/{key}"] = np.ascontiguousarray(imgs.transpose(0, 3, 1, 2))
                continue
            frames = None
            file_of = self.video_file_of[key][ids]
            for file_id in np.unique(file_of):
                rows = np.flatnonzero(file_of == file_id)
                try:
                    decoded = decode_frames(
                        self.video_paths[key][file_id], self.video_time[key][ids[rows]]
                    )
                except VideoDecodeError as e:
                    eps = describe_episodes(self.episode_of[ids[rows]])
                    raise VideoDecodeError(f"{e}; feature {key!r}, {eps}") from e
                if frames is None:
                    frames = np.empty((len(ids), *decoded.shape[1:]), dtype=np.uint8)
                frames[rows] = decoded
            out[f"image/{key}"] = np.ascontiguousarray(frames.transpose(0, 3, 1, 2))
        return out


@dataclass
class DatasetView:
    meta: LeRobotMeta
    source: LeRobotSource
    plan: SamplePlan
    val_ids: np.ndarray
    normalizer: Normalizer
    transform: BatchTransform
    fingerprint: str
    target_image_size: list[int] = field(default_factory=list)  # `data.image_size`; [] = native

    @classmethod
    def open(
        cls, cfg: DataConfig, seed: int, global_batch_size: int, max_text_len: int = 48
    ) -> DatasetView:
        root = Path(cfg.root).expanduser()
        meta = LeRobotMeta.load(root)
        if (root / "shards.json").is_file():  # precomputed shards (data/arrow.py), same samples
            from raytrain_vla.data.arrow import ShardSource

            source = ShardSource(root, cfg.chunk_size)
        else:
            source = LeRobotSource(meta, cfg.chunk_size)
        val_eps = split_episodes(meta.num_episodes, cfg.val_fraction, cfg.val_episodes)
        is_val = np.isin(source.episode_of, val_eps)
        train_ids = np.flatnonzero(~is_val)
        plan = SamplePlan(
            train_ids,
            source.episode_of[train_ids],
            seed,
            global_batch_size,
            cfg.span_len,
            cfg.shuffle_window,
        )
        val_ids = np.flatnonzero(is_val)
        if len(val_ids) > cfg.val_max_samples:
            val_ids = val_ids[
                np.linspace(0, len(val_ids) - 1, cfg.val_max_samples).astype(np.int64)
            ]
        normalizer = Normalizer.from_stats(
            meta.stats,
            cfg.normalization,
            cfg.normalization_per_feature,
            source=str(meta.root / "meta" / "stats.json"),
        )
        transform = BatchTransform(normalizer, meta.tasks, source.camera_keys, max_text_len)
        # Shards carry their source's fingerprint: same samples, so a run may switch formats.
        fingerprint = getattr(source, "fingerprint", None) or dataset_fingerprint(meta)
        return cls(
            meta, source, plan, val_ids, normalizer, transform, fingerprint, list(cfg.image_size)
        )

    @property
    def camera_keys(self) -> list[str]:
        return self.source.camera_keys

    @property
    def image_size(self) -> list[int]:
        """What the model sees: `data.image_size` when set, else the first camera's size."""
        if self.target_image_size:
            return list(self.target_image_size)
        _, h, w = self.meta.camera_shape(self.camera_keys[0])
        return [h, w]

    @property
    def state_dim(self) -> int:
        return self.meta.state_dim

    @property
    def action_dim(self) -> int:
        return self.meta.action_dim

    @property
    def tasks(self) -> list[str]:
        return list(self.meta.tasks)

    @property
    def mean_action(self) -> np.ndarray:
        return np.asarray(self.meta.stats[ACTION]["mean"], dtype=np.float32)
