"""A map-style LeRobot dataset: `open_dataset(root, delta_timestamps)[i]` as LeRobot returns it.

Mirrors LeRobot 0.6's `LeRobotDataset(root=..., delta_timestamps=...)[i]` key for key: every
parquet column as a torch tensor (floats as float32, ints as int64, scalars 0-d, the way
`hf_transform_to_torch` turns them), cameras as float32 CHW in [0, 1], windows of frames at
`i + round(delta * fps)` clamped to the episode with `<key>_is_pad` masks, and the `task` string.
It exists so that people can check what they train on against LeRobot (the fixtures under
`shared/fixtures/lerobot_v3` hold LeRobot's own items) and for debugging; training streams
through `source.LeRobotSource`, which reads the same files.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.images import ImageRows
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.video import VideoDecodeError, decode_frames

DEFAULT_TOLERANCE_S = 1e-4  # LeRobot's default: a frame must be this close to its timestamp


class LeRobotFrames:
    """Frames of a LeRobot v2.1/v3.0 dataset by global index, as LeRobot's own items."""

    def __init__(
        self,
        meta: LeRobotMeta,
        delta_timestamps: dict[str, list[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
    ):
        self.meta, self.tolerance_s = meta, tolerance_s
        self.delta_indices = _delta_indices(meta, delta_timestamps or {}, tolerance_s)
        stored = [k for k, f in meta.features.items() if f["dtype"] not in ("video", "image")]
        table = read_frames_table(meta, stored)
        self.columns = {k: _torch_like(table[k]) for k in stored}
        self.image_rows = ImageRows(meta) if meta.image_keys else None
        self.episode_of = self.columns["episode_index"].astype(np.int64)
        self.task_index = self.columns["task_index"].astype(np.int64)
        self.timestamp = self.columns["timestamp"]
        for key in meta.video_keys:  # fail at open, not at the thousandth item
            for e in range(meta.num_episodes):
                if not meta.video_file(key, e).is_file():
                    raise DatasetError(
                        f"{meta.video_file(key, e)}: video file missing; "
                        f"feature {key!r}, episode {e}"
                    )

    def __len__(self) -> int:
        return self.meta.total_frames

    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def camera_keys(self) -> list[str]:
        return self.meta.camera_keys

    def __getitem__(self, idx: int) -> dict:
        idx = int(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"frame {idx} out of range for {len(self)} frames")
        ep = int(self.episode_of[idx])
        lo, hi = int(self.meta.episode_from_index[ep]), int(self.meta.episode_to_index[ep])
        query, pads = {}, {}
        for key, deltas in self.delta_indices.items():
            wanted = idx + deltas
            query[key] = np.clip(wanted, lo, hi - 1)
            pads[f"{key}_is_pad"] = torch.from_numpy((wanted < lo) | (wanted >= hi))
        item: dict = {}
        for key in self.meta.features:
            feat = self.meta.features[key]
            rows = query.get(key, np.array([idx]))
            if feat["dtype"] == "image":
                imgs = self.image_rows.read(key, rows, np.full(len(rows), ep))
                item[key] = _to_float_chw(imgs, key not in query)
            elif feat["dtype"] != "video":
                col = self.columns[key]
                item[key] = _tensor(col[rows] if key in query else col[idx])
        item.update(pads)
        videos = {
            k: self._video(k, ep, query.get(k, np.array([idx]))) for k in self.meta.video_keys
        }
        for k in videos:
            if k not in query:
                videos[k] = videos[k][0]
        item = {**videos, **item}  # LeRobot puts decoded video first
        item["task"] = self.meta.tasks[int(self.task_index[idx])]
        return item

    def _video(self, key: str, ep: int, rows: np.ndarray) -> torch.Tensor:
        path = self.meta.video_file(key, ep)
        start = self.meta.video_from_timestamp(key, ep)
        times = [start + float(t) for t in self.timestamp[rows]]
        try:
            frames = decode_frames(path, times, tolerance_s=self.tolerance_s)
        except VideoDecodeError as e:
            raise VideoDecodeError(f"{e}; feature {key!r}, episode {ep}") from e
        return _to_float_chw(frames, squeeze=False)


def _delta_indices(
    meta: LeRobotMeta, delta_timestamps: dict[str, list[float]], tolerance_s: float
) -> dict[str, np.ndarray]:
    """{key: frame offsets}; keys must be features, deltas multiples of 1/fps (as LeRobot)."""
    out = {}
    for key, deltas in delta_timestamps.items():
        if key not in meta.features:
            raise DatasetError(
                f"{meta.root / 'meta/info.json'}: delta_timestamps key {key!r} is not a feature "
                f"(features: {', '.join(meta.features)})"
            )
        for d in deltas:
            if not math.isfinite(d) or abs(d * meta.fps - round(d * meta.fps)) / meta.fps > (
                tolerance_s
            ):
                raise DatasetError(
                    f"delta_timestamps[{key!r}]: {d} s is not a multiple of 1/fps = "
                    f"{1 / meta.fps:.6g} s (within {tolerance_s} s)"
                )
        out[key] = np.array([round(d * meta.fps) for d in deltas], dtype=np.int64)
    return out


def _torch_like(col: pa.ChunkedArray) -> np.ndarray:
    """(N, *shape) numpy in the dtype LeRobot's items carry (python float -> float32 etc.)."""
    out = to_numpy(col)
    if out.dtype.kind == "f":
        return out.astype(np.float32)
    if out.dtype.kind in "iu":
        return out.astype(np.int64)
    return out


def _tensor(value: np.ndarray | np.generic) -> torch.Tensor | str:
    if isinstance(value, str):
        return value
    return torch.from_numpy(np.array(value))  # a copy, 0-d for a scalar


def _to_float_chw(frames: np.ndarray, squeeze: bool) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> float32 (T, 3, H, W) / 255, like ToTensor and torchcodec."""
    out = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous().to(torch.float32) / 255
    return out[0] if squeeze else out


def open_dataset(
    root: str | Path,
    delta_timestamps: dict[str, list[float]] | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> LeRobotFrames:
    """What `LeRobotDataset(root=root, delta_timestamps=...)` gives, from local files only."""
    return LeRobotFrames(LeRobotMeta.load(root), delta_timestamps, tolerance_s)
