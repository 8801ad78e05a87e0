"""A LeRobot dataset's episodes read back whole, as the `EpisodeData` the writer takes.

It exists so that a dataset can grow: `data metaworld --base` copies an existing dataset's
episodes into a new one and adds its own after them (more demos, or DAgger's on-policy
episodes), so that training sees one dataset with one normalisation. One data file is held at
a time, and one episode's frames. PNG cells come back bit for bit; video frames are decoded
(an mp4 re-encoded by the writer loses what its crf loses, near nothing at crf 18).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.images import decode_images
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta, iter_frames_tables
from raytrain_vla.data.formats.video import decode_frames
from raytrain_vla.data.formats.writer import SCALARS, EpisodeData

STATE, ACTION = "observation.state", "action"


def extra_columns(meta: LeRobotMeta) -> list[str]:
    """The per-frame columns besides cameras, state, action and LeRobot's bookkeeping."""
    skip = {STATE, ACTION, *SCALARS, *meta.camera_keys}
    return [k for k in meta.features if k not in skip]


def read_episodes(root: str | Path) -> Iterator[EpisodeData]:
    """Every episode of the dataset at `root`, in episode order, with its frames as (T, H, W, 3)
    uint8 and its extra columns in their stored dtypes. Raises DatasetError (naming the file
    and episode) for an episode with more than one task: `EpisodeData` holds one."""
    meta = LeRobotMeta.load(root)
    extras = extra_columns(meta)
    columns = [STATE, ACTION, "frame_index", *extras, *meta.image_keys]
    for path, episodes, _first, table in iter_frames_tables(meta, columns):
        episode_of = table.column("episode_index").to_numpy()
        for e in episodes:
            rows = np.flatnonzero(episode_of == e)
            tasks = meta.episode_tasks(int(e))
            if len(tasks) != 1:
                raise DatasetError(f"{path}: episode {e} has tasks {tasks}, expected one")
            part = table.take(rows)
            cameras = {
                key: decode_images(part.column(key), f"{path}: feature {key!r}", None, meta.root)
                for key in meta.image_keys
            }
            times = to_numpy(part.column("frame_index")) / meta.fps
            for key in meta.video_keys:
                start = meta.video_from_timestamp(key, int(e))
                cameras[key] = decode_frames(meta.video_file(key, int(e)), start + times)
            yield EpisodeData(
                {k: cameras[k] for k in meta.camera_keys},
                to_numpy(part.column(STATE)), to_numpy(part.column(ACTION)), tasks[0],
                {k: to_numpy(part.column(k)) for k in extras},
            )  # fmt: skip
