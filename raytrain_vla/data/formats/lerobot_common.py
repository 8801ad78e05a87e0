"""What both LeRobot metadata versions share: file readers whose errors name the file, the
feature and episode checks, and `meta/stats.json`.

Kept apart from `lerobot.py` so that the v2.1 loader can use it without importing the module that
dispatches to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from raytrain_vla.common.location import join_inside, read_schema_names, read_table
from raytrain_vla.errors import NotRetriable


class DatasetError(NotRetriable, ValueError):
    """The dataset on disk disagrees with what its metadata (or the LeRobot format) promises."""


def inside_root(root: Path, relative: str, where: str) -> Path:
    """`root / relative`, refused when it resolves outside `root`. Lexically: symlinks out of the
    root (the Hugging Face cache links snapshots to blobs) are the user's choice; a `..` or an
    absolute path in a file the dataset ships is not."""
    path, inside = join_inside(root, relative)
    if not inside:
        raise DatasetError(f"{where}: {relative!r} names {path}, outside the dataset root {root}")
    return path


def read_json(path: Path, what: str) -> dict:
    try:
        with path.open() as f:
            out = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; expected {what}") from None
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: not valid JSON ({e}); expected {what}") from e
    if not isinstance(out, dict):
        raise DatasetError(f"{path}: expected a JSON object with {what}")
    return out


def read_parquet(path: Path, columns: Sequence[str] | None = None, where: str = "") -> pa.Table:
    """The table (or `columns` of it); `where` (e.g. "episodes 0-4") is added to errors."""
    at = f"; in {where}" if where else ""
    try:
        if columns is not None:
            present = set(read_schema_names(path))
            missing = [c for c in columns if c not in present]
            if missing:
                raise DatasetError(f"{path}: missing column(s) {missing}{at}")
        return read_table(path, list(columns) if columns is not None else None)
    except DatasetError:
        raise
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing parquet file{at}") from None
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: unreadable parquet file ({e}){at}") from e


def check_features(root: Path, info: dict) -> list[str]:
    """The video keys, after checking that `features` is usable."""
    info_path = root / "meta" / "info.json"
    features = info["features"]
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        raise DatasetError(f"{info_path}: 'features' must be an object of feature objects")
    bad = [k for k, f in features.items() if "dtype" not in f or "shape" not in f]
    if bad:
        raise DatasetError(f"{info_path}: feature(s) {bad} lack 'dtype' or 'shape'")
    videos = [k for k, f in features.items() if f.get("dtype") == "video"]
    if videos and not info.get("video_path"):
        raise DatasetError(f"{info_path}: video features {videos} but no 'video_path' template")
    return videos


def load_stats_json(root: Path) -> dict[str, dict[str, np.ndarray]]:
    """meta/stats.json as arrays, or {} when the dataset has none."""
    stats_path = root / "meta" / "stats.json"
    if not stats_path.exists():
        return {}
    raw = read_json(stats_path, "feature statistics")
    return {f: {s: np.asarray(v) for s, v in d.items()} for f, d in raw.items()}


def check_episodes(where: Path, info: dict, eps: dict[str, np.ndarray]) -> None:
    """Episodes 0..E-1, contiguous frame ranges matching their lengths and info.json totals."""
    idx, length = eps["episode_index"], eps["length"]
    if not len(idx):
        raise DatasetError(f"{where}: no episodes")
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
