"""LeRobot dataset metadata (`meta/`) and the frame table (`data/`), read with pyarrow.

Only the v3.0 layout is read today; `LeRobotMeta.load` dispatches on `codebase_version` so a
v2.1 loader (tasks.jsonl, episodes.jsonl, one file per episode) can be added beside it. Every
inconsistency raises `DatasetError` naming the file, episode or column and what was expected,
because a silent mismatch between metadata and data would corrupt training quietly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SUPPORTED_VERSIONS = ("v3.0",)
_EPISODE_COLUMNS = ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index")
_EPISODE_COLUMNS += ("data/chunk_index", "data/file_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
_INFO_KEYS = ("codebase_version", "fps", "features", "total_episodes", "total_frames", "data_path")


class DatasetError(ValueError):
    """The dataset on disk disagrees with what its metadata (or the LeRobot format) promises."""


def _read_json(path: Path, what: str) -> dict:
    try:
        with open(path) as f:
            out = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; expected {what}") from None
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: not valid JSON ({e}); expected {what}") from e
    if not isinstance(out, dict):
        raise DatasetError(f"{path}: expected a JSON object with {what}")
    return out


def _read_parquet(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    try:
        if columns is not None:
            present = set(pq.read_schema(path).names)
            missing = [c for c in columns if c not in present]
            if missing:
                raise DatasetError(f"{path}: missing column(s) {missing}")
        return pq.read_table(path, columns=list(columns) if columns is not None else None)
    except DatasetError:
        raise
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing parquet file") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: unreadable parquet file ({e})") from e


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
        root = Path(root)
        info_path = root / "meta" / "info.json"
        info = _read_json(info_path, "LeRobot dataset info (fps, features, ...)")
        missing = [k for k in _INFO_KEYS if k not in info]
        if missing:
            raise DatasetError(f"{info_path}: missing key(s) {missing}")
        version = str(info["codebase_version"])
        if version not in _LOADERS:
            raise DatasetError(
                f"{info_path}: codebase_version {version!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
            )
        return _LOADERS[version](root, info)

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
        return self._dim("observation.state")

    @property
    def action_dim(self) -> int:
        return self._dim("action")

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

    def data_file(self, episode: int) -> Path:
        chunk, file = (
            self.episodes["data/chunk_index"][episode],
            self.episodes["data/file_index"][episode],
        )
        return self.root / self.info["data_path"].format(chunk_index=chunk, file_index=file)

    def video_file(self, key: str, episode: int) -> Path:
        chunk = self.episodes[f"videos/{key}/chunk_index"][episode]
        file = self.episodes[f"videos/{key}/file_index"][episode]
        return self.root / self.info["video_path"].format(
            video_key=key, chunk_index=chunk, file_index=file
        )

    def video_from_timestamp(self, key: str, episode: int) -> float:
        """Where the episode starts inside its (concatenated) video file, in seconds."""
        return float(self.episodes[f"videos/{key}/from_timestamp"][episode])


def _load_v30(root: Path, info: dict) -> LeRobotMeta:
    info_path = root / "meta" / "info.json"
    features = info["features"]
    if not isinstance(features, dict):
        raise DatasetError(f"{info_path}: 'features' must be an object")
    videos = [k for k, f in features.items() if f.get("dtype") == "video"]
    if videos and not info.get("video_path"):
        raise DatasetError(f"{info_path}: video features {videos} but no 'video_path' template")

    tasks_path = root / "meta" / "tasks.parquet"
    tt = _read_parquet(tasks_path)
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
    table = pa.concat_tables([_read_parquet(p, cols) for p in ep_files])
    table = table.take(pc.sort_indices(table["episode_index"]))
    eps = {c: table[c].to_numpy() for c in cols if c != "tasks"}
    eps["tasks"] = np.empty(table.num_rows, dtype=object)  # 1-D array of lists of strings
    eps["tasks"][:] = table["tasks"].to_pylist()
    _check_episodes(root, info, eps)

    stats_path = root / "meta" / "stats.json"
    raw = _read_json(stats_path, "feature statistics") if stats_path.exists() else {}
    stats = {f: {s: np.asarray(v) for s, v in d.items()} for f, d in raw.items()}
    return LeRobotMeta(root, info, tasks, eps, stats)


def _check_episodes(root: Path, info: dict, eps: dict[str, np.ndarray]) -> None:
    where = root / "meta" / "episodes"
    idx, length = eps["episode_index"], eps["length"]
    lo, hi = eps["dataset_from_index"], eps["dataset_to_index"]
    if not np.array_equal(idx, np.arange(len(idx))):
        raise DatasetError(f"{where}: episode_index is not 0..{len(idx) - 1} without gaps")
    for e in np.flatnonzero(hi - lo != length):
        raise DatasetError(
            f"{where}: episode {e} has length {length[e]} but dataset_from_index={lo[e]}, "
            f"dataset_to_index={hi[e]}"
        )
    starts = np.concatenate([[0], hi[:-1]])
    for e in np.flatnonzero(lo != starts):
        raise DatasetError(f"{where}: episode {e} starts at frame {lo[e]}, expected {starts[e]}")
    if len(idx) != int(info["total_episodes"]):
        raise DatasetError(
            f"{where}: {len(idx)} episodes but info.json says {info['total_episodes']}"
        )
    if int(hi[-1]) != int(info["total_frames"]):
        raise DatasetError(
            f"{where}: episodes cover {hi[-1]} frames but info.json says {info['total_frames']}"
        )


_LOADERS = {"v3.0": _load_v30}


def read_frames_table(meta: LeRobotMeta, columns: Sequence[str]) -> pa.Table:
    """All frames' `columns` (plus `index`), in global index order, checked against info.json."""
    cols = list(dict.fromkeys(["index", *columns]))
    files: list[Path] = []
    for e in range(meta.num_episodes):
        path = meta.data_file(e)
        if not files or files[-1] != path:
            files.append(path)
    parts, expect = [], 0
    for path in dict.fromkeys(files):  # each file once, in the order episodes reference it
        t = _read_parquet(path, cols)
        index = t["index"].to_numpy()
        if len(index) and not np.array_equal(index, np.arange(expect, expect + len(index))):
            raise DatasetError(
                f"{path}: column 'index' is not contiguous from {expect} "
                f"(got {index[:3].tolist()}...)"
            )
        for c in cols:
            _check_column(path, c, t[c], meta.features.get(c))
        parts.append(t)
        expect += len(index)
    if expect != meta.total_frames:
        raise DatasetError(
            f"{meta.root / 'data'}: {expect} frames but info.json says {meta.total_frames}"
        )
    return pa.concat_tables(parts) if parts else pa.table({c: [] for c in cols})


def _check_column(path: Path, name: str, col: pa.ChunkedArray, feat: dict | None) -> None:
    """Shape and dtype of one column against its info.json feature; NaN is refused."""
    if col.null_count:
        raise DatasetError(f"{path}: column {name!r} has {col.null_count} null value(s)")
    if feat is None or feat.get("dtype") in ("video", "image", "string"):
        return
    size = int(np.prod(feat["shape"]))
    typ = col.type
    if pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
        lens = pc.list_value_length(col).to_numpy() if len(col) else np.array([size])
        if not (lens == size).all():
            raise DatasetError(
                f"{path}: column {name!r} has rows of length {sorted(set(lens.tolist()))[:5]}, "
                f"info.json shape is {feat['shape']}"
            )
        values = pc.list_flatten(col)
    elif size != 1:
        raise DatasetError(f"{path}: column {name!r} is scalar, info.json shape is {feat['shape']}")
    else:
        values = col
    want = np.dtype(feat["dtype"]) if feat["dtype"] not in ("bool",) else np.dtype(bool)
    got = values.type.to_pandas_dtype()
    if np.dtype(got) != want:
        raise DatasetError(
            f"{path}: column {name!r} has dtype {np.dtype(got)}, info.json says {want}"
        )
    if want.kind == "f" and len(values) and pc.any(pc.is_nan(values)).as_py():
        raise DatasetError(f"{path}: column {name!r} contains NaN")


def column_to_numpy(table: pa.Table, name: str) -> np.ndarray:
    """(N, ...) numpy array of a scalar or (fixed-size) list column."""
    col = table[name].combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        return np.asarray(col.to_pylist())
    return col.to_numpy(zero_copy_only=False)
