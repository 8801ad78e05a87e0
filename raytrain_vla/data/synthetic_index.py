"""A LeRobot v3.0 index with no files behind it: scale benchmarks and tests of what grows.

Episodes of 100-300 frames packed like LeRobot's writer does (500 per data file, 100 per video
file, each episode at its offset inside the shared video), two 480x640 cameras, 14-D state and
action, and `tasks` instructions. Open it with `LeRobotSource(meta, chunk, checked_files=False)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raytrain_vla.data.formats.lerobot import LeRobotMeta

CAMERAS = ("observation.images.top", "observation.images.wrist")
STATE_DIM = ACTION_DIM = 14
EPISODES_PER_DATA_FILE, EPISODES_PER_VIDEO_FILE = 500, 100


def synthetic_meta(frames: int, episodes: int, tasks: int = 1000) -> LeRobotMeta:
    rng = np.random.default_rng(0)
    length = rng.integers(100, 301, episodes)
    length = np.maximum(1, np.floor(length * frames / length.sum())).astype(np.int64)
    short = frames - int(length.sum())  # rounding down leaves < episodes frames over
    if short < 0:
        raise ValueError(f"{episodes} episodes of at least one frame exceed {frames} frames")
    np.add.at(length, np.arange(short) % episodes, 1)  # every length stays positive
    end = np.cumsum(length)
    video = {"dtype": "video", "shape": [480, 640, 3], "names": ["height", "width", "channels"]}
    features = {k: dict(video) for k in CAMERAS}
    features |= {
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM]},
        "action": {"dtype": "float32", "shape": [ACTION_DIM]},
    }
    for name in ("timestamp",):
        features[name] = {"dtype": "float32", "shape": [1]}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1]}
    info = {
        "codebase_version": "v3.0", "fps": 30, "features": features,
        "total_episodes": episodes, "total_frames": frames,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    }  # fmt: skip
    eps = {
        "episode_index": np.arange(episodes), "length": length,
        "dataset_from_index": end - length, "dataset_to_index": end,
        "data/chunk_index": np.arange(episodes) // (EPISODES_PER_DATA_FILE * 1000),
        "data/file_index": np.arange(episodes) // EPISODES_PER_DATA_FILE % 1000,
    }  # fmt: skip
    video_file = np.arange(episodes) // EPISODES_PER_VIDEO_FILE
    starts = np.zeros(episodes)
    for f in np.unique(video_file):  # seconds into the shared file where each episode starts
        sel = video_file == f
        starts[sel] = np.cumsum(length[sel]) / 30 - length[sel] / 30
    for key in CAMERAS:
        eps[f"videos/{key}/chunk_index"] = video_file // 1000
        eps[f"videos/{key}/file_index"] = video_file % 1000
        eps[f"videos/{key}/from_timestamp"] = starts
        eps[f"videos/{key}/to_timestamp"] = starts + length / 30
    task_names = [f"task {i}: pick the object and place it in the bin" for i in range(tasks)]
    eps["tasks"] = np.empty(episodes, dtype=object)
    eps["tasks"][:] = [[task_names[e % tasks]] for e in range(episodes)]
    return LeRobotMeta(Path("/synthetic"), info, task_names, eps, stats={})
