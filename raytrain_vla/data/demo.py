"""Write the demo task (the reaching simulator's expert) as a LeRobot v3.0 dataset.

The layout, column names, dtypes and nesting follow what LeRobot 0.6 itself writes (compare
`shared/fixtures/lerobot_v3/pusht_like`), so the same files load in LeRobot and here. The dataset
is built in a hidden sibling directory and renamed into place, so an interrupted write never
leaves a half dataset behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.data import sim
from raytrain_vla.data.video import DEFAULT_CRF, DEFAULT_GOP, DEFAULT_PRESET, encode_video

IMAGE_KEY = "observation.image"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
_SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def _features(size: int, fps: int) -> dict:
    video_info = {
        "video.height": size, "video.width": size, "video.codec": "h264",
        "video.pix_fmt": "yuv420p", "video.fps": fps, "video.channels": 3, "has_audio": False,
        "video.g": DEFAULT_GOP, "video.crf": DEFAULT_CRF, "video.preset": DEFAULT_PRESET,
        "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {},
        "is_depth_map": False,
    }  # fmt: skip
    feats: dict = {
        IMAGE_KEY: {"dtype": "video", "shape": [size, size, 3],
                    "names": ["height", "width", "channels"], "info": video_info},
        "observation.state": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    }  # fmt: skip
    feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for k in _SCALARS[1:]:
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
    episodes = [sim.rollout_expert(rng, image_size) for _ in range(num_episodes)]
    tmp = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        _write(tmp, episodes, image_size, sim.FPS)
        if root.exists():
            root.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _write(out: Path, episodes: list[sim.Episode], size: int, fps: int) -> None:
    features = _features(size, fps)
    lengths = np.array([len(e.states) for e in episodes])
    ends = np.cumsum(lengths)
    starts = ends - lengths
    n, n_eps = int(ends[-1]), len(episodes)
    task_names = list(dict.fromkeys(e.scene.instruction for e in episodes))
    task_of = {t: i for i, t in enumerate(task_names)}
    ep_task = np.array([task_of[e.scene.instruction] for e in episodes])
    cols = {
        "observation.state": np.concatenate([e.states for e in episodes]).astype(np.float32),
        "action": np.concatenate([e.actions for e in episodes]).astype(np.float32),
        "episode_index": np.repeat(np.arange(n_eps), lengths),
        "index": np.arange(n),
    }
    cols["frame_index"] = cols["index"] - np.repeat(starts, lengths)
    cols["timestamp"] = (cols["frame_index"] / fps).astype(np.float32)
    cols["task_index"] = np.repeat(ep_task, lengths)

    images = np.concatenate([e.images for e in episodes])
    encode_video(
        out / VIDEO_PATH.format(video_key=IMAGE_KEY, chunk_index=0, file_index=0), images, fps
    )

    # data/: one row per frame; vectors are fixed-size lists as LeRobot writes them
    vec = pa.list_(pa.field("element", pa.float32()), 2)
    arrays = {k: pa.FixedSizeListArray.from_arrays(pa.array(cols[k].reshape(-1)), type=vec)
              for k in ("observation.state", "action")}  # fmt: skip
    arrays.update({k: pa.array(cols[k]) for k in _SCALARS})
    table = pa.table(arrays).replace_schema_metadata({"huggingface": _hf_metadata(features)})
    (out / "data/chunk-000").mkdir(parents=True)
    pq.write_table(table, out / DATA_PATH.format(chunk_index=0, file_index=0), compression="snappy")

    # per-episode stats, then meta/episodes
    per_ep: dict[str, list[dict]] = {k: [] for k in features}
    hist_all = np.zeros((3, 256), np.int64)  # summed per-episode histograms: exact global stats
    for a, b in zip(starts, ends, strict=True):
        pix = images[a:b].reshape(-1, 3).astype(np.int64) + np.array([0, 256, 512])
        hist = np.bincount(pix.ravel(), minlength=768).reshape(3, 256)
        hist_all += hist
        per_ep[IMAGE_KEY].append(_image_stats(hist, int(b - a)))
        for k in features:
            if k != IMAGE_KEY:
                per_ep[k].append(_vector_stats(cols[k][a:b].reshape(b - a, -1)))
    ep_cols: dict[str, pa.Array] = {
        "episode_index": pa.array(np.arange(n_eps)),
        "tasks": pa.array([[task_names[t]] for t in ep_task], type=pa.list_(pa.string())),
        "length": pa.array(lengths.astype(np.int64)),
        "data/chunk_index": pa.array(np.zeros(n_eps, np.int64)),
        "data/file_index": pa.array(np.zeros(n_eps, np.int64)),
        "dataset_from_index": pa.array(starts.astype(np.int64)),
        "dataset_to_index": pa.array(ends.astype(np.int64)),
        f"videos/{IMAGE_KEY}/chunk_index": pa.array(np.zeros(n_eps, np.int64)),
        f"videos/{IMAGE_KEY}/file_index": pa.array(np.zeros(n_eps, np.int64)),
        f"videos/{IMAGE_KEY}/from_timestamp": pa.array(starts / fps),
        f"videos/{IMAGE_KEY}/to_timestamp": pa.array(ends / fps),
    }
    for k, rows in per_ep.items():
        for stat in rows[0]:
            arr = np.stack([r[stat] for r in rows])
            ep_cols[f"stats/{k}/{stat}"] = _nested(
                arr, pa.int64() if stat == "count" else pa.float64()
            )
    ep_cols["meta/episodes/chunk_index"] = pa.array(np.zeros(n_eps, np.int64))
    ep_cols["meta/episodes/file_index"] = pa.array(np.zeros(n_eps, np.int64))
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
    stats: dict[str, dict] = {IMAGE_KEY: _image_stats(hist_all, n)}
    for k in features:
        if k != IMAGE_KEY:
            stats[k] = _vector_stats(cols[k].reshape(n, -1))
    _write_json(
        out / "meta/stats.json",
        {k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()},
    )

    info = {
        "codebase_version": "v3.0", "fps": fps, "features": features,
        "total_episodes": n_eps, "total_frames": n, "total_tasks": len(task_names),
        "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "data_path": DATA_PATH, "video_path": VIDEO_PATH, "robot_type": "sim_reach",
        "splits": {"train": f"0:{n_eps}"},
    }  # fmt: skip
    _write_json(out / "meta/info.json", info)


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=4)
