"""LeRobot samples by id: what Ray Data read tasks carry and call.

`LeRobotSource` holds the low-dimensional columns as small numpy arrays plus video paths, so a
task decodes only the frames of its own samples. Image features stored inside parquet are read
per task too, from the row groups that hold those samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raytrain_vla.data.formats.frame_checks import describe_episodes
from raytrain_vla.data.formats.images import ImageRows
from raytrain_vla.data.formats.lerobot import (
    ACTION,
    STATE,
    DatasetError,
    LeRobotMeta,
    column_to_numpy,
    read_frames_table,
)
from raytrain_vla.data.formats.video import VideoDecodeError, decode_frames


class LeRobotSource:
    """Reads samples (frame index + its action chunk) by global frame index."""

    def __init__(self, meta: LeRobotMeta, chunk_size: int):
        missing = [k for k in (STATE, ACTION) if k not in meta.features]
        if missing:
            raise DatasetError(
                f"{meta.root / 'meta' / 'info.json'}: features {missing} are required"
            )
        table = read_frames_table(
            meta, ["episode_index", "frame_index", "timestamp", "task_index", STATE, ACTION]
        )
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
            for path in paths:  # at open, on the driver: not mid-run inside a retried read task
                if not Path(path).is_file():
                    raise DatasetError(
                        f"{path}: video file missing; feature '{key}', episode {files.index(path)}"
                    )
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
