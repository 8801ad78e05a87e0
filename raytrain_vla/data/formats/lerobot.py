"""LeRobot dataset metadata (`meta/`) and the frame table (`data/`), read with pyarrow.

`LeRobotMeta.load` dispatches on `codebase_version`: v3.0 (parquet metadata, many episodes per
file, concatenated videos) and v2.1 (jsonl metadata, one parquet and one mp4 per episode). Both
fill the same per-episode columns, so everything downstream is version-blind. Every
inconsistency raises `DatasetError` naming the file, episode or column and what was expected,
because a silent mismatch between metadata and data would corrupt training quietly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raytrain_vla.common.features import ACTION, STATE
from raytrain_vla.common.location import as_path, sizes_under
from raytrain_vla.data.formats.frame_checks import (
    describe_episodes,
    frame_problems,
    timestamp_problems,
)
from raytrain_vla.data.formats.lerobot_common import (
    DatasetError,
    check_episodes,
    check_features,
    inside_root,
    load_stats_json,
    read_json,
    read_parquet,
)
from raytrain_vla.data.formats.lerobot_v21 import load_v21

__all__ = ["ACTION", "STATE", "DatasetError", "LeRobotMeta", "read_frames_table"]

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
_EPISODE_COLUMNS = ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index")
_EPISODE_COLUMNS += ("data/chunk_index", "data/file_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
_INFO_KEYS = ("codebase_version", "fps", "features", "total_episodes", "total_frames", "data_path")


@dataclass
class LeRobotMeta:
    """What `meta/` says about a dataset: features, tasks, per-episode ranges, stats."""

    root: Path
    info: dict
    tasks: list[str]  # task string by task_index
    episodes: dict[str, np.ndarray]  # per-episode columns (no stats), sorted by episode_index
    stats: dict[str, dict[str, np.ndarray]]

    @classmethod
    def load(cls, root: str | Path) -> LeRobotMeta:
        root = as_path(root)
        info_path = root / "meta" / "info.json"
        info = read_json(info_path, "LeRobot dataset info (fps, features, ...)")
        missing = [k for k in _INFO_KEYS if k not in info]
        if missing:
            raise DatasetError(f"{info_path}: missing key(s) {missing}")
        version = str(info["codebase_version"])
        if version not in SUPPORTED_VERSIONS:
            raise DatasetError(
                f"{info_path}: codebase_version {version!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
            )
        if version == "v2.1":
            return cls(root, info, *load_v21(root, info))
        return _load_v30(root, info)

    # -- info.json -------------------------------------------------------------------------
    @property
    def version(self) -> str:
        return str(self.info["codebase_version"])

    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    @property
    def features(self) -> dict[str, dict]:
        return self.info["features"]

    @property
    def total_frames(self) -> int:
        return int(self.info["total_frames"])

    @property
    def num_episodes(self) -> int:
        return len(self.episode_index)

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") in ("video", "image")]

    def _dim(self, key: str) -> int:
        if key not in self.features:
            raise DatasetError(f"{self.root / 'meta/info.json'}: no feature {key!r}")
        return int(np.prod(self.features[key]["shape"]))

    @property
    def state_dim(self) -> int:
        return self._dim(STATE)

    @property
    def action_dim(self) -> int:
        return self._dim(ACTION)

    def camera_shape(self, key: str) -> tuple[int, int, int]:
        """(C, H, W) of a camera feature, reading the layout from its `names`."""
        feat = self.features[key]
        shape = [int(s) for s in feat["shape"]]
        names = [str(n).lower() for n in (feat.get("names") or [])]
        if len(shape) != 3:
            raise DatasetError(f"{self.root / 'meta/info.json'}: {key} shape {shape} is not 3-D")
        if names and names[-1] in ("channel", "channels", "c"):
            return shape[2], shape[0], shape[1]
        if names and names[0] in ("channel", "channels", "c"):
            return shape[0], shape[1], shape[2]
        if shape[-1] in (1, 3, 4):  # no usable names: LeRobot's default is HWC
            return shape[2], shape[0], shape[1]
        return shape[0], shape[1], shape[2]

    # -- episodes ------------------------------------------------------------------------
    @property
    def episode_index(self) -> np.ndarray:
        return self.episodes["episode_index"]

    @property
    def episode_length(self) -> np.ndarray:
        return self.episodes["length"]

    @property
    def episode_from_index(self) -> np.ndarray:
        return self.episodes["dataset_from_index"]

    @property
    def episode_to_index(self) -> np.ndarray:
        return self.episodes["dataset_to_index"]

    def episode_tasks(self, episode: int) -> list[str]:
        return list(self.episodes["tasks"][episode])

    @cached_property
    def task_index_of(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tasks)}

    def tasks_of_episodes(self, episodes: np.ndarray) -> dict[int, str]:
        """{task_index: task} of every task these episodes list: all a read task may meet."""
        out = {}
        for e in np.unique(episodes):
            for t in self.episode_tasks(int(e)):
                if t in self.task_index_of:
                    out[self.task_index_of[t]] = t
        return out

    def _path(self, template: str, **fields) -> Path:
        """A file the dataset names, never outside its root."""
        info_path = self.root / "meta/info.json"
        pattern = self.info.get(template)
        try:
            relative = str(self.info[template]).format(**fields)
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise DatasetError(f"{info_path}: bad {template!r} {pattern!r} ({e!r})") from e
        return inside_root(self.root, relative, f"{info_path}: {template!r} {pattern!r}")

    def data_file(self, episode: int) -> Path:
        chunk = int(self.episodes["data/chunk_index"][episode])
        file = int(self.episodes["data/file_index"][episode])
        ep = int(self.episode_index[episode])  # v2.1 templates name the episode, v3.0 the file
        return self._path(
            "data_path", chunk_index=chunk, file_index=file, episode_chunk=chunk, episode_index=ep
        )

    def data_files(self) -> dict[Path, np.ndarray]:
        """Each data file once, in the order episodes reference it, with the episodes it holds."""
        files: dict[Path, list[int]] = {}
        for e in range(self.num_episodes):
            files.setdefault(self.data_file(e), []).append(e)
        return {path: np.asarray(eps, dtype=np.int64) for path, eps in files.items()}

    def video_file(self, key: str, episode: int) -> Path:
        chunk = int(self.episodes[f"videos/{key}/chunk_index"][episode])
        file = int(self.episodes[f"videos/{key}/file_index"][episode])
        ep = int(self.episode_index[episode])
        return self._path(
            "video_path", video_key=key, chunk_index=chunk, file_index=file,
            episode_chunk=chunk, episode_index=ep,
        )  # fmt: skip

    def video_from_timestamp(self, key: str, episode: int) -> float:
        """Where the episode starts inside its video file, in seconds (0 for v2.1)."""
        return float(self.episodes[f"videos/{key}/from_timestamp"][episode])


def _load_v30(root: Path, info: dict) -> LeRobotMeta:
    videos = check_features(root, info)
    tasks_path = root / "meta" / "tasks.parquet"
    tt = read_parquet(tasks_path)
    if "task_index" not in tt.column_names or "task" not in tt.column_names:
        raise DatasetError(f"{tasks_path}: expected columns 'task' and 'task_index'")
    order = np.argsort(tt["task_index"].to_numpy())
    tasks = [tt["task"].to_pylist()[i] for i in order]
    if not np.array_equal(tt["task_index"].to_numpy()[order], np.arange(len(tasks))):
        raise DatasetError(f"{tasks_path}: task_index is not 0..{len(tasks) - 1}")

    ep_files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not ep_files:
        raise DatasetError(f"{root / 'meta/episodes'}: no chunk-*/file-*.parquet episode files")
    cols = list(_EPISODE_COLUMNS) + [f"videos/{k}/{c}" for k in videos for c in _VIDEO_COLUMNS]
    table = pa.concat_tables([read_parquet(p, cols) for p in ep_files])
    table = table.take(pc.sort_indices(table["episode_index"]))
    eps = {c: table[c].to_numpy() for c in cols if c != "tasks"}
    eps["tasks"] = np.empty(table.num_rows, dtype=object)  # 1-D array of lists of strings
    eps["tasks"][:] = table["tasks"].to_pylist()
    check_episodes(root / "meta" / "episodes", info, eps)
    return LeRobotMeta(root, info, tasks, eps, load_stats_json(root))


def iter_frames_tables(
    meta: LeRobotMeta, columns: Sequence[str]
) -> Iterator[tuple[Path, np.ndarray, int, pa.Table]]:
    """(path, episodes, first global index, checked table) per data file, one file at a time,
    so a caller that keeps nothing holds one file's columns at most."""
    cols = list(dict.fromkeys(["index", "episode_index", *columns]))
    expect = 0
    for path, eps in meta.data_files().items():
        table = read_parquet(path, cols, describe_episodes(eps))
        problems = frame_problems(path, table, meta.features, eps, meta.episode_length, expect)
        if not problems and {"timestamp", "frame_index"} <= set(cols):
            problems = timestamp_problems(path, table, meta.fps)
        if problems:
            raise DatasetError(problems[0])
        yield path, eps, expect, table
        expect += table.num_rows
    if expect != meta.total_frames:
        raise DatasetError(
            f"{meta.root / 'data'}: {expect} frames but info.json says {meta.total_frames}"
        )


def read_frames_table(meta: LeRobotMeta, columns: Sequence[str]) -> pa.Table:
    """All frames' `columns` (plus `index`, `episode_index`) in global index order, checked."""
    parts = [table for *_, table in iter_frames_tables(meta, columns)]
    cols = list(dict.fromkeys(["index", "episode_index", *columns]))
    return pa.concat_tables(parts) if parts else pa.table({c: [] for c in cols})


def dataset_fingerprint(meta: LeRobotMeta) -> str:
    """Content hash of `meta/` plus the path and size of every other file under the root: the
    data and video files wherever the templates put them and any image file a cell names (none
    can lie outside the root). Hidden entries (the `.cache/` that `huggingface-cli download
    --local-dir` keeps) are skipped. A dataset with only meta/, data/ and videos/ keeps the
    fingerprint earlier versions gave it, so existing runs still resume."""
    h = hashlib.sha256()
    sizes = sizes_under(meta.root)
    files = sorted(PurePosixPath(p) for p in sizes)
    for path in (p for p in files if p.parts[0] == "meta"):
        h.update(str(path).encode())
        h.update((meta.root / str(path)).read_bytes())
    for top in ("data", "videos", None):
        for path in files:
            if path.parts[0] == top or (top is None and path.parts[0] not in _KNOWN_TOPS):
                h.update(f"{path}:{sizes[str(path)]}".encode())
    return h.hexdigest()[:16]


_KNOWN_TOPS = ("meta", "data", "videos")
