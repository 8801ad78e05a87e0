"""Reading shards: `ShardSource` indexes a shards directory, `ShardRead` is one read task.

A shard read is a parquet row-group read plus `take` (`row_groups.read_rows`), then images
decoded from raw CHW bytes or PNG: `ShardSource.read` returns exactly what `LeRobotSource.read`
returns, pixel for pixel, without decoding video.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from raytrain_vla.common.image_ops import resize_images
from raytrain_vla.common.location import as_path
from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.row_groups import read_rows
from raytrain_vla.data.formats.shards.manifest import (
    LIST_COLUMNS,
    MANIFEST,
    SCALAR_COLUMNS,
    check_cover,
    load_manifest,
    shard_path,
)
from raytrain_vla.data.formats.shards.png import decode_png

_READ_COLUMNS = ["sample_id", "state", "actions", "action_is_pad", "task_index"]


class ShardSource:
    """The index of a shards directory; hands each read task a `ShardRead` that names only the
    shards its samples lie in."""

    def __init__(self, root: str | os.PathLike, chunk_size: int):
        self.root = as_path(root)
        m = load_manifest(self.root)
        if int(m["chunk_size"]) != chunk_size:
            raise DatasetError(
                f"{self.root / MANIFEST}: shards were written with chunk_size {m['chunk_size']} "
                f"but chunk_size {chunk_size} was requested; convert again or use {m['chunk_size']}"
            )
        self.chunk_size = chunk_size
        self.image_format = str(m["image_format"])
        self.cameras = {k: tuple(int(s) for s in v) for k, v in m["cameras"].items()}
        self.camera_keys = list(self.cameras)
        self.fingerprint = str(m["source_fingerprint"])
        self.num_samples = int(m["num_samples"])
        self.state_dim, self.action_dim = int(m["state_dim"]), int(m["action_dim"])
        self.first_ids = np.array([e["first_sample_id"] for e in m["shards"]], dtype=np.int64)
        check_cover(m["shards"], self.num_samples, str(self.root / MANIFEST))
        self.files = [str(shard_path(self.root, e)) for e in m["shards"]]  # absolute: picklable
        self.meta = LeRobotMeta.load(self.root)
        if self.meta.total_frames != self.num_samples:
            raise DatasetError(
                f"{self.root}: shards.json has {self.num_samples} samples, "
                f"meta/info.json {self.meta.total_frames} frames"
            )
        self.episode_ends = self.meta.episode_to_index.astype(np.int64)

    @cached_property
    def episode_of(self) -> np.ndarray:
        """Episode of every sample (O(samples): tools and tests, never a read task)."""
        return np.repeat(np.arange(len(self.episode_ends)), np.diff(self.episode_ends, prepend=0))

    def reader(
        self, sample_ids: np.ndarray, frame_size: tuple[int, int] | None = None
    ) -> ShardRead:
        """The shards these samples lie in; `frame_size` (H, W) resizes every camera in the task
        (as `LeRobotSource.reader` does while decoding)."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        bad = ids[(ids < 0) | (ids >= self.num_samples)]
        if len(bad):
            raise DatasetError(
                f"{self.root}: ids {bad[:5].tolist()} not in 0..{self.num_samples - 1}"
            )
        shard = np.searchsorted(self.first_ids, ids, side="right") - 1
        used, local = np.unique(shard, return_inverse=True)
        tasks = self.meta.tasks_of_episodes(np.searchsorted(self.episode_ends, ids, side="right"))
        return ShardRead(
            ids=ids,
            files=[self.files[i] for i in used],
            first_ids=self.first_ids[used],
            shard=local.astype(np.int32),
            chunk_size=self.chunk_size,
            image_format=self.image_format,
            cameras=self.cameras,
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            tasks=tasks,
            frame_size=None if frame_size is None else (int(frame_size[0]), int(frame_size[1])),
        )

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The same columns, dtypes and values as `LeRobotSource.read(sample_ids)`."""
        return self.reader(sample_ids).read()


@dataclass
class ShardRead:
    """Samples of one read task and the shards that hold them."""

    ids: np.ndarray
    files: list[str]
    first_ids: np.ndarray
    shard: np.ndarray  # per sample: index into files
    chunk_size: int
    image_format: str
    cameras: dict[str, tuple[int, int, int]]
    state_dim: int
    action_dim: int
    tasks: dict[int, str]  # task strings of these samples' episodes, by task_index
    frame_size: tuple[int, int] | None = None  # (H, W) every camera is resized to, if set

    def _columns(self, shard: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Rows `rows` of one shard, in that order, as `LeRobotSource.read` columns."""
        where, n, chunk = self.files[shard], len(rows), self.chunk_size
        names = _READ_COLUMNS + [f"image/{k}" for k in self.cameras]
        table = read_rows(where, rows, names, raw=True)
        shapes = {"sample_id": (), "state": (self.state_dim,), "actions": (chunk, self.action_dim)}
        shapes |= {"action_is_pad": (chunk,), "task_index": ()}  # LeRobotSource's column order
        out = {}
        for key, shape in shapes.items():
            dtype = SCALAR_COLUMNS.get(key) or LIST_COLUMNS[key]
            out[key] = to_numpy(table[key]).reshape(n, *shape).astype(dtype)
        for key, shape in self.cameras.items():
            col = table[f"image/{key}"].combine_chunks()
            if self.image_format == "png":
                out[f"image/{key}"] = decode_png(col.to_pylist(), shape, f"{where} {key}")
            elif n:
                width = int(np.prod(shape))
                flat = np.frombuffer(col.buffers()[1], np.uint8, n * width, col.offset * width)
                out[f"image/{key}"] = flat.reshape(n, *shape).copy()
            else:
                out[f"image/{key}"] = np.empty((0, *shape), np.uint8)
        if self.frame_size is not None:
            images = {k: v for k, v in out.items() if k.startswith("image/")}
            out |= resize_images(images, self.frame_size)
        return out

    def read(self) -> dict[str, np.ndarray]:
        ids = self.ids
        out: dict[str, np.ndarray] = {}
        if not len(ids):  # typed empty columns
            chunk, dims = self.chunk_size, {"state": (self.state_dim,)}
            dims |= {"actions": (chunk, self.action_dim), "action_is_pad": (chunk,)}
            dtypes = {**SCALAR_COLUMNS, **LIST_COLUMNS}
            out = {k: np.empty((0, *dims.get(k, ())), t) for k, t in dtypes.items()
                   if k in ("sample_id", "task_index", *dims)}  # fmt: skip
            out |= {
                f"image/{k}": np.empty((0, v[0], *(self.frame_size or v[1:])), np.uint8)
                for k, v in self.cameras.items()
            }
        for s in range(len(self.files)):
            sel = np.flatnonzero(self.shard == s)
            part = self._columns(s, ids[sel] - self.first_ids[s])
            if not np.array_equal(part["sample_id"], ids[sel]):  # cheap guard against bad files
                raise DatasetError(f"{self.files[s]}: rows disagree with the ids in {MANIFEST}")
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((len(ids), *value.shape[1:]), dtype=value.dtype)
                out[key][sel] = value
        task = np.empty(len(ids), dtype=object)
        for i, t in enumerate(out.get("task_index", np.zeros(0, np.int64)).tolist()):
            if t not in self.tasks:
                raise DatasetError(
                    f"{self.files[self.shard[i]]}: sample {ids[i]} has task_index {t}, not a task "
                    "of its episode in meta/episodes"
                )
            task[i] = self.tasks[t]
        cameras = {k: v for k, v in out.items() if k.startswith("image/")}
        low = {k: v for k, v in out.items() if not k.startswith("image/")}
        return {**low, "task": task, **cameras}
