"""Write episodes as a LeRobot v3.0 dataset: any cameras, image size, codec, GOP and crf.

The layout, column names, dtypes and nesting follow what LeRobot 0.6 itself writes (the tests
compare against datasets LeRobot 0.6.1 wrote), so the same files load in LeRobot and here. Each camera
is one concatenated video file; an episode's frames start at its `from_timestamp` in that file.
The dataset is built in a hidden sibling directory and renamed into place, so an interrupted
write never leaves a half dataset behind and an existing dataset is never overwritten.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.common.atomic import atomic_directory, refuse_non_empty
from raytrain_vla.data.formats.video import PIX_FMT, encode_video

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# info.json names the codec as the stream reports it, not the encoder that wrote it
_CODEC_NAMES = {"libx264": "h264", "libx265": "hevc", "libsvtav1": "av1", "libaom-av1": "av1"}


@dataclass(frozen=True)
class VideoSpec:
    """How every camera is encoded. The defaults are LeRobot's: AV1, a keyframe every 2 frames."""

    codec: str = "libsvtav1"
    crf: int | None = 30
    gop: int = 2
    preset: str | int | None = 12


@dataclass
class EpisodeData:
    """One episode: per-camera (T, H, W, 3) uint8 frames, (T, S) states, (T, A) actions."""

    cameras: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    task: str


@dataclass
class DatasetSpec:
    """Dataset-wide metadata that is not in the episodes themselves."""

    fps: int
    video: VideoSpec = field(default_factory=VideoSpec)
    robot_type: str = "unknown"
    state_names: list[str] | None = None
    action_names: list[str] | None = None


def write_lerobot_dataset(
    root: str | os.PathLike, episodes: Sequence[EpisodeData], spec: DatasetSpec
) -> Path:
    """Write `episodes` as a LeRobot v3.0 dataset at `root` (missing or an empty directory)."""
    root = Path(root)
    refuse_non_empty(root)
    _check_episodes(episodes)
    with atomic_directory(root) as tmp:
        _write(tmp, episodes, spec)
    return root


def _check_episodes(episodes: Sequence[EpisodeData]) -> None:
    """Every episode has the same cameras and shapes, and one row per frame everywhere."""
    if not episodes:
        raise ValueError("no episodes to write")
    first = episodes[0]
    for i, ep in enumerate(episodes):
        t = len(ep.state)
        if t < 1 or len(ep.action) != t:
            raise ValueError(f"episode {i}: {t} states and {len(ep.action)} actions")
        if list(ep.cameras) != list(first.cameras):
            raise ValueError(f"episode {i}: cameras {list(ep.cameras)} != {list(first.cameras)}")
        if (
            ep.state.shape[1:] != first.state.shape[1:]
            or ep.action.shape[1:] != first.action.shape[1:]
        ):
            raise ValueError(f"episode {i}: state/action shapes differ from episode 0")
        for key, frames in ep.cameras.items():
            want = (t, *first.cameras[key].shape[1:])
            if frames.shape != want or frames.dtype != np.uint8 or frames.shape[-1] != 3:
                raise ValueError(
                    f"episode {i} camera {key}: frames {frames.shape} {frames.dtype}, "
                    f"expected {want} uint8 RGB"
                )


def _features(episodes: Sequence[EpisodeData], spec: DatasetSpec) -> dict:
    v = spec.video
    feats: dict = {}
    for key, frames in episodes[0].cameras.items():
        h, w = frames.shape[1:3]
        info = {
            "video.height": h, "video.width": w, "video.codec": _CODEC_NAMES.get(v.codec, v.codec),
            "video.pix_fmt": PIX_FMT, "video.fps": spec.fps, "video.channels": 3,
            "has_audio": False, "video.g": v.gop, "video.crf": v.crf, "video.preset": v.preset,
            "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {},
            "is_depth_map": False,
        }  # fmt: skip
        feats[key] = {"dtype": "video", "shape": [h, w, 3],
                      "names": ["height", "width", "channels"], "info": info}  # fmt: skip
    for key, arr, names in (
        ("observation.state", episodes[0].state, spec.state_names),
        ("action", episodes[0].action, spec.action_names),
    ):
        dim = int(np.prod(arr.shape[1:]))
        names = names or [f"{key.split('.')[-1]}_{i}" for i in range(dim)]
        feats[key] = {"dtype": "float32", "shape": [dim], "names": names}
    feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for k in SCALARS[1:]:
        feats[k] = {"dtype": "int64", "shape": [1], "names": None}
    return feats


def _vector_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-feature stats over axis 0 of (N, D) values: min/max/mean/std/count/q*."""
    x = x.astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    out["count"] = np.array([len(x)])
    qs = np.quantile(x, list(QUANTILES.values()), axis=0)
    out.update({name: q for name, q in zip(QUANTILES, qs, strict=True)})
    return out


def _histogram(frames: np.ndarray) -> np.ndarray:
    """(3, 256) per-channel pixel counts: summable, so global stats stay exact."""
    pix = frames.reshape(-1, 3).astype(np.int64) + np.array([0, 256, 512])
    return np.bincount(pix.ravel(), minlength=768).reshape(3, 256)


def _image_stats(hist: np.ndarray, n_frames: int) -> dict[str, np.ndarray]:
    """Per-channel stats, shaped (3, 1, 1) in [0, 1], exact from (3, 256) pixel histograms."""
    v = np.arange(256) / 255.0
    total = hist.sum(1, keepdims=True)
    mean = (hist * v).sum(1) / total[:, 0]
    std = np.sqrt((hist * (v - mean[:, None]) ** 2).sum(1) / total[:, 0])
    cum = np.cumsum(hist, 1)
    out = {"min": v[(cum > 0).argmax(1)], "max": v[(cum >= total).argmax(1)]}
    out.update(mean=mean, std=std)
    for name, q in QUANTILES.items():  # numpy's default ("linear") quantile of the pixels
        pos = q * (total[:, 0] - 1)
        rank = np.stack([np.floor(pos), np.ceil(pos)], 1)  # (3, 2) sorted-pixel ranks
        lo, hi = v[
            np.stack([np.searchsorted(c, r, side="right") for c, r in zip(cum, rank, strict=True)])
        ].T
        out[name] = lo + (hi - lo) * (pos - rank[:, 0])
    shaped = {k: a.reshape(3, 1, 1) for k, a in out.items()}
    order = ["min", "max", "mean", "std", "count", *QUANTILES]  # LeRobot's column order
    return {k: np.array([n_frames]) if k == "count" else shaped[k] for k in order}


def _nested(arr: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """(E, *dims) numpy -> E rows of nested variable-size lists, as LeRobot stores stats."""
    flat = pa.array(arr.reshape(-1), type=dtype)
    for n in reversed(arr.shape[1:]):
        flat = pa.ListArray.from_arrays(
            pa.array(np.arange(0, len(flat) + 1, n, dtype=np.int32)), flat
        )
    return flat


def _hf_metadata(features: dict) -> bytes:
    """The `huggingface` schema metadata LeRobot's parquet files carry (datasets.Features)."""
    hf = {}
    for k, f in features.items():
        if f["dtype"] == "video":
            continue
        value = {"dtype": f["dtype"], "_type": "Value"}
        hf[k] = (
            value
            if f["shape"] == [1]
            else {"feature": value, "length": f["shape"][0], "_type": "List"}
        )
    return json.dumps({"info": {"features": hf}}).encode()


def _write(out: Path, episodes: Sequence[EpisodeData], spec: DatasetSpec) -> None:
    fps, features = spec.fps, _features(episodes, spec)
    cameras = list(episodes[0].cameras)
    lengths = np.array([len(e.state) for e in episodes])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    n, n_eps = int(ends[-1]), len(episodes)
    task_names = list(dict.fromkeys(e.task for e in episodes))
    task_of = {t: i for i, t in enumerate(task_names)}
    ep_task = np.array([task_of[e.task] for e in episodes])
    cols = {
        "observation.state": np.concatenate([e.state for e in episodes]).astype(np.float32),
        "action": np.concatenate([e.action for e in episodes]).astype(np.float32),
        "episode_index": np.repeat(np.arange(n_eps), lengths),
        "index": np.arange(n),
    }
    cols["frame_index"] = cols["index"] - np.repeat(starts, lengths)
    cols["timestamp"] = (cols["frame_index"] / fps).astype(np.float32)
    cols["task_index"] = np.repeat(ep_task, lengths)

    # videos/: one file per camera, all episodes back to back; histograms for the stats
    hists: dict[str, list[np.ndarray]] = {}
    v = spec.video
    for key in cameras:
        frames = np.concatenate([e.cameras[key] for e in episodes])
        path = out / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        encode_video(path, frames, fps, codec=v.codec, crf=v.crf, gop=v.gop, preset=v.preset)
        hists[key] = [_histogram(frames[a:b]) for a, b in zip(starts, ends, strict=True)]
        del frames

    # data/: one row per frame; vectors are fixed-size lists as LeRobot writes them
    arrays = {}
    for k in ("observation.state", "action"):
        vec = pa.list_(pa.field("element", pa.float32()), features[k]["shape"][0])
        arrays[k] = pa.FixedSizeListArray.from_arrays(pa.array(cols[k].reshape(-1)), type=vec)
        cols[k] = cols[k].reshape(n, -1)
    arrays.update({k: pa.array(cols[k]) for k in SCALARS})
    table = pa.table(arrays).replace_schema_metadata({"huggingface": _hf_metadata(features)})
    (out / "data/chunk-000").mkdir(parents=True)
    pq.write_table(table, out / DATA_PATH.format(chunk_index=0, file_index=0), compression="snappy")

    # per-episode stats, then meta/episodes
    per_ep: dict[str, list[dict]] = {k: [] for k in features}
    for e, (a, b) in enumerate(zip(starts, ends, strict=True)):
        for k in features:
            if k in hists:
                per_ep[k].append(_image_stats(hists[k][e], int(b - a)))
            else:
                per_ep[k].append(_vector_stats(cols[k][a:b].reshape(b - a, -1)))
    zeros = pa.array(np.zeros(n_eps, np.int64))
    ep_cols: dict[str, pa.Array] = {
        "episode_index": pa.array(np.arange(n_eps)),
        "tasks": pa.array([[task_names[t]] for t in ep_task], type=pa.list_(pa.string())),
        "length": pa.array(lengths.astype(np.int64)),
        "data/chunk_index": zeros,
        "data/file_index": zeros,
        "dataset_from_index": pa.array(starts.astype(np.int64)),
        "dataset_to_index": pa.array(ends.astype(np.int64)),
    }
    for key in cameras:
        ep_cols[f"videos/{key}/chunk_index"] = zeros
        ep_cols[f"videos/{key}/file_index"] = zeros
        ep_cols[f"videos/{key}/from_timestamp"] = pa.array(starts / fps)
        ep_cols[f"videos/{key}/to_timestamp"] = pa.array(ends / fps)
    for k, rows in per_ep.items():
        for stat in rows[0]:
            arr = np.stack([r[stat] for r in rows])
            ep_cols[f"stats/{k}/{stat}"] = _nested(
                arr, pa.int64() if stat == "count" else pa.float64()
            )
    ep_cols["meta/episodes/chunk_index"] = zeros
    ep_cols["meta/episodes/file_index"] = zeros
    (out / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table(ep_cols), out / "meta/episodes/chunk-000/file-000.parquet")

    # meta/tasks.parquet: written through pandas, so `task` is the index as LeRobot stores it
    import pandas as pd

    tasks_df = pd.DataFrame(
        {"task_index": np.arange(len(task_names))},
        index=pd.Index(task_names, name="task", dtype=object),
    )
    tasks_df.to_parquet(out / "meta/tasks.parquet")

    # meta/stats.json over all frames
    stats: dict[str, dict] = {}
    for k in features:
        if k in hists:
            stats[k] = _image_stats(np.sum(hists[k], axis=0), n)
        else:
            stats[k] = _vector_stats(cols[k].reshape(n, -1))
    _write_json(
        out / "meta/stats.json",
        {k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()},
    )

    info = {
        "codebase_version": "v3.0", "fps": fps, "features": features,
        "total_episodes": n_eps, "total_frames": n, "total_tasks": len(task_names),
        "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "data_path": DATA_PATH, "video_path": VIDEO_PATH, "robot_type": spec.robot_type,
        "splits": {"train": f"0:{n_eps}"},
    }  # fmt: skip
    _write_json(out / "meta/info.json", info)


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=4)
