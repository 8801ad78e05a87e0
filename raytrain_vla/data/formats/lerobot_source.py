"""LeRobot samples by id: the rank-side index, and the reads that Ray Data tasks carry.

`LeRobotSource` checks every data file once at open but keeps only per-episode and per-file
numbers (O(episodes + files)). `reader(ids)` turns the ids of one read task into a
`LeRobotRead` that carries just those samples' file rows, video files (as `CompactPaths`:
patterns and numbers, not strings) and times, and the task strings of their episodes: what a
task is sent does not grow with the dataset. The task reads
its rows' row groups itself (cached per process, see `row_groups.py`) and decodes its frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from raytrain_vla.common.image_ops import resize_frames_hwc
from raytrain_vla.common.location import as_path
from raytrain_vla.common.object_cache import CacheConfig
from raytrain_vla.data.formats.compact_paths import CompactPaths
from raytrain_vla.data.formats.frame_checks import describe_episodes
from raytrain_vla.data.formats.images import decode_images
from raytrain_vla.data.formats.lerobot import (
    ACTION,
    STATE,
    DatasetError,
    LeRobotMeta,
    iter_frames_tables,
)
from raytrain_vla.data.formats.row_groups import read_rows
from raytrain_vla.data.formats.video import VideoDecodeError, decode_frames

_LOW_DIM = ("timestamp", "task_index", STATE, ACTION)


class LeRobotSource:
    """The index of a LeRobot dataset that hands out per-task reads by global frame index."""

    def __init__(self, meta: LeRobotMeta, chunk_size: int, checked_files: bool = True):
        """Checks every data file (columns against info.json, tasks against the episodes) and
        that every video file exists, unless `checked_files` is False: then `meta` alone
        describes the files (benchmarks over synthetic indexes)."""
        missing = [k for k in (STATE, ACTION) if k not in meta.features]
        if missing:
            raise DatasetError(
                f"{meta.root / 'meta' / 'info.json'}: features {missing} are required"
            )
        self.meta = meta
        self.chunk_size = chunk_size
        self.camera_keys = meta.camera_keys  # video and image features, in info.json order
        self.image_shapes = {k: meta.camera_shape(k) for k in meta.image_keys}
        self.cache: CacheConfig | None = None  # node-local copies of remote videos (DatasetView)
        self.episode_start = meta.episode_from_index.astype(np.int64)
        self.episode_end = meta.episode_to_index.astype(np.int64)
        files = meta.data_files()
        self.data_paths = [str(p) for p in files]
        self.file_of_episode = np.zeros(meta.num_episodes, np.int64)
        for f, eps in enumerate(files.values()):
            self.file_of_episode[eps] = f
        # Global index of each data file's first row (files hold consecutive episodes).
        self.file_start = np.array([self.episode_start[eps].min() for eps in files.values()])
        if checked_files:
            columns = ["frame_index", *_LOW_DIM]
            for f, (path, _, first, table) in enumerate(iter_frames_tables(meta, columns)):
                self._check_tasks(path, table)
                if first != self.file_start[f]:  # same file order as meta.data_files()
                    raise DatasetError(f"{path}: its first row is frame {first}, not its episodes'")
        self.video_paths: dict[str, list[str]] = {}
        self.video_file_of_episode: dict[str, np.ndarray] = {}
        self.video_offset: dict[str, np.ndarray] = {}
        for key in meta.video_keys:
            names = [str(meta.video_file(key, e)) for e in range(meta.num_episodes)]
            paths = sorted(set(names))
            for path in paths if checked_files else []:  # at open: not inside a read task
                if not as_path(path).is_file():
                    raise DatasetError(
                        f"{path}: video file missing; feature '{key}', episode {names.index(path)}"
                    )
            path_id = {f: i for i, f in enumerate(paths)}
            self.video_paths[key] = paths
            self.video_file_of_episode[key] = np.array([path_id[f] for f in names], np.int64)
            self.video_offset[key] = np.array(
                [meta.video_from_timestamp(key, e) for e in range(meta.num_episodes)]
            )

    def _check_tasks(self, path: Path, table) -> None:
        """Every frame's task is one its episode lists: a read task is sent only those."""
        pairs = np.unique(
            np.stack([table["episode_index"].to_numpy(), table["task_index"].to_numpy()], 1), axis=0
        )
        for episode, task in pairs.tolist():
            listed = self.meta.tasks_of_episodes(np.array([episode]))
            if task not in listed:
                raise DatasetError(
                    f"{path}: frames of episode {episode} have task_index {task}, which is not "
                    f"among the episode's tasks {self.meta.episode_tasks(episode)} in meta/episodes"
                )

    @cached_property
    def episode_of(self) -> np.ndarray:
        """Episode of every frame (O(frames): tools and tests, never a read task)."""
        return np.repeat(np.arange(len(self.episode_end)), self.episode_end - self.episode_start)

    def episodes_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.episode_end, ids, side="right")

    def reader(
        self, sample_ids: np.ndarray, frame_size: tuple[int, int] | None = None
    ) -> LeRobotRead:
        """What one read task needs for these samples, and nothing else; `frame_size` (H, W)
        has every camera resized as its frames are decoded."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.meta.total_frames):
            raise DatasetError(f"{self.meta.root}: ids outside 0..{self.meta.total_frames - 1}")
        eps = self.episodes_of(ids)
        used, file_local = np.unique(self.file_of_episode[eps], return_inverse=True)
        start = self.file_start[used][file_local]
        videos = {}
        for key, paths in self.video_paths.items():
            v_used, v_local = np.unique(self.video_file_of_episode[key][eps], return_inverse=True)
            videos[key] = VideoRefs(
                CompactPaths.of([paths[i] for i in v_used]),
                v_local.astype(np.int32),
                self.video_offset[key][eps],
                self.meta.camera_shape(key)[1:],
            )
        return LeRobotRead(
            ids=ids,
            episodes=eps,
            data_paths=CompactPaths.of([self.data_paths[i] for i in used]),
            data_file=file_local.astype(np.int32),
            row=ids - start,
            row_end=self.episode_end[eps] - start,
            chunk_size=self.chunk_size,
            videos=videos,
            image_shapes=self.image_shapes,
            camera_keys=self.camera_keys,
            tasks=self.meta.tasks_of_episodes(eps),
            state_dim=self.meta.state_dim,
            action_dim=self.meta.action_dim,
            root=str(self.meta.root),
            cache=self.cache,
            frame_size=None if frame_size is None else (int(frame_size[0]), int(frame_size[1])),
        )

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        return self.reader(sample_ids).read()


@dataclass
class VideoRefs:
    """One camera's video files used by a read, and each sample's file and start offset."""

    paths: Sequence[str]  # CompactPaths in a read task
    file: np.ndarray  # per sample: index into paths
    offset: np.ndarray  # per sample: where its episode starts in that file, seconds
    hw: tuple[int, int]  # the frames' size, as info.json gives it (for an empty read)


@dataclass
class LeRobotRead:
    """Samples of one read task: file rows and video references only (a few bytes a sample)."""

    ids: np.ndarray
    episodes: np.ndarray
    data_paths: Sequence[str]  # CompactPaths in a read task
    data_file: np.ndarray  # per sample: index into data_paths
    row: np.ndarray  # per sample: its row in that file
    row_end: np.ndarray  # per sample: one past its episode's last row in that file
    chunk_size: int
    videos: dict[str, VideoRefs]
    image_shapes: dict[str, tuple[int, int, int]]
    camera_keys: list[str]
    tasks: dict[int, str]  # task strings of these samples' episodes, by task_index
    state_dim: int
    action_dim: int
    root: str
    cache: CacheConfig | None = None
    # (H, W) every camera is resized to as it is decoded (the processor's size): the task then
    # holds model-size frames only, so it can hold more samples for the same memory.
    frame_size: tuple[int, int] | None = None

    def read(self) -> dict[str, np.ndarray]:
        out, timestamp, images = self.read_rows()
        for key in self.camera_keys:
            frames = images.get(key)
            if frames is None:  # decoded straight into the model's (N, C, H, W)
                out[f"image/{key}"] = self.decode(key, self.videos[key].offset + timestamp)
            else:
                out[f"image/{key}"] = np.ascontiguousarray(frames.transpose(0, 3, 1, 2))
        return out

    def read_rows(self) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """(low-dimensional columns, frame timestamps, image features as NHWC) from the data
        files: everything but video."""
        n, chunk = len(self.ids), self.chunk_size
        steps = self.row[:, None] + np.arange(chunk)[None]
        rows = np.minimum(steps, self.row_end[:, None] - 1)  # edge action repeated, like LeRobot
        state = np.empty((n, self.state_dim), np.float32)
        actions = np.empty((n, chunk, self.action_dim), np.float32)
        timestamp = np.empty(n, np.float64)
        task_index = np.empty(n, np.int64)
        images = {
            k: np.empty((n, *(self.frame_size or s[1:]), 3), np.uint8)
            for k, s in self.image_shapes.items()
        }
        for f, path in enumerate(self.data_paths):
            sel = np.flatnonzero(self.data_file == f)
            wanted = np.unique(np.concatenate([self.row[sel], rows[sel].reshape(-1)]))
            low = read_rows(path, wanted, list(_LOW_DIM))
            at = np.searchsorted(wanted, self.row[sel])
            state[sel] = low[STATE][at].reshape(len(sel), -1)
            actions[sel] = low[ACTION][np.searchsorted(wanted, rows[sel])].reshape(
                len(sel), chunk, -1
            )
            timestamp[sel] = low["timestamp"][at]
            task_index[sel] = low["task_index"][at]
            if self.image_shapes:
                cells = read_rows(path, self.row[sel], list(self.image_shapes), raw=True)
                for key, shape in self.image_shapes.items():
                    where = f"{path}: feature {key!r}"
                    imgs = decode_images(cells[key], where, self.episodes[sel], as_path(self.root))
                    if imgs.shape[1:3] != shape[1:]:
                        raise DatasetError(
                            f"{where}: images are {imgs.shape[1:3]}, info.json says "
                            f"{shape[1:]}; in {describe_episodes(self.episodes[sel])}"
                        )
                    images[key][sel] = resize_frames_hwc(imgs, self.frame_size)
        out = {
            "sample_id": self.ids,
            "state": state,
            "actions": actions,
            "action_is_pad": steps >= self.row_end[:, None],
            "task_index": task_index,
            "task": self._task_strings(task_index),
        }
        return out, timestamp, images

    def _task_strings(self, task_index: np.ndarray) -> np.ndarray:
        out = np.empty(len(task_index), dtype=object)
        for i, t in enumerate(task_index.tolist()):
            if t in self.tasks:
                out[i] = self.tasks[t]
            else:  # the source checked this at open: the file changed since
                raise DatasetError(
                    f"{self.root}: frame {self.ids[i]} has task_index {t}, which is not a task of "
                    f"its {describe_episodes([self.episodes[i]])} in meta/episodes"
                )
        return out

    def decode(self, key: str, times: np.ndarray) -> np.ndarray:
        """(N, 3, H, W) frames of camera `key` at each sample's time in its video file."""
        refs = self.videos[key]
        frames = None
        for f, path in enumerate(refs.paths):
            sel = np.flatnonzero(refs.file == f)
            try:
                decoded = decode_frames(
                    path, times[sel], cache=self.cache, size=self.frame_size, channels_first=True
                )
            except VideoDecodeError as e:
                raise VideoDecodeError(
                    f"{e}; feature {key!r}, {describe_episodes(self.episodes[sel])}"
                ) from e
            if len(sel) == len(self.ids):  # one file holds them all (v3's usual case): no copy
                return decoded
            if frames is None:
                frames = np.empty((len(self.ids), *decoded.shape[1:]), dtype=np.uint8)
            frames[sel] = decoded
        if frames is None:
            return np.zeros((0, 3, *(self.frame_size or refs.hw)), np.uint8)
        return frames
