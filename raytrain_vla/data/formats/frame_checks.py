"""Checks of frame columns against `info.json` features, returning problems as messages.

Pure (a pyarrow table in, strings out) so that `read_frames_table` raises the first problem while
`inspect.find_problems` reports them all. Every message names the file, the column and the
episode(s) of the offending rows, because that is what someone has to go and fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def describe_episodes(episodes: Sequence[int] | np.ndarray) -> str:
    """'episode 3', 'episodes 0-5' or 'episodes 1, 4, 9': for error messages."""
    eps = sorted({int(e) for e in np.asarray(episodes).reshape(-1)})
    if len(eps) == 1:
        return f"episode {eps[0]}"
    if eps and eps == list(range(eps[0], eps[-1] + 1)):
        return f"episodes {eps[0]}-{eps[-1]}"
    return "episodes " + ", ".join(map(str, eps[:6])) + (", ..." if len(eps) > 6 else "")


def frame_problems(
    path: Path,
    table: pa.Table,
    features: dict[str, dict],
    episodes: np.ndarray,
    episode_length: np.ndarray,
    start: int,
) -> list[str]:
    """What is wrong with one data file holding `episodes`, whose first global index is `start`:
    row count, `index`, `episode_index` and every feature column."""
    where = describe_episodes(episodes)
    want_eps = np.repeat(episodes, episode_length[episodes])
    if table.num_rows != len(want_eps):
        return [f"{path}: {table.num_rows} rows, the episodes say {len(want_eps)}; in {where}"]
    out = []
    index = table["index"].to_numpy()
    if not np.array_equal(index, np.arange(start, start + len(index))):
        out.append(
            f"{path}: column 'index' is not contiguous from {start} "
            f"(got {index[:3].tolist()}...); in {where}"
        )
    got_eps = table["episode_index"].to_numpy()
    for r in np.flatnonzero(got_eps != want_eps)[:1]:
        out.append(f"{path}: row {r} has episode_index {got_eps[r]}, expected {want_eps[r]}")
    for name in table.column_names:
        out += column_problems(path, name, table[name], features.get(name), want_eps)
    return out


def column_problems(
    path: Path, name: str, col: pa.ChunkedArray, feat: dict | None, row_episode: np.ndarray
) -> list[str]:
    """Shape and dtype of one column against its info.json feature; NaN and inf are refused."""

    def at(rows: np.ndarray) -> str:
        return f"; in {describe_episodes(row_episode[rows])}" if len(rows) else ""

    every = np.arange(len(col))
    if col.null_count:
        nulls = np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))
        return [f"{path}: column {name!r} has {col.null_count} null value(s){at(nulls[:1])}"]
    if feat is None or feat.get("dtype") in ("video", "string"):
        return []
    if feat.get("dtype") == "image":
        if not (pa.types.is_struct(col.type) and col.type.get_field_index("bytes") >= 0):
            return [f"{path}: image column {name!r} is {col.type}, not {{bytes, path}}{at(every)}"]
        return []
    shape = [int(d) for d in feat["shape"]]
    values, level = col, 0
    while _is_list(values.type):
        if level >= len(shape):
            return [f"{path}: column {name!r} nests deeper than shape {feat['shape']}{at(every)}"]
        lens = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        want = shape[level] if len(shape) > 1 else int(np.prod(shape))
        bad = np.flatnonzero(lens != want) // int(np.prod(shape[:level]))  # -> frame rows
        if len(bad):
            got = sorted(set(lens.tolist()))[:5]
            return [
                f"{path}: column {name!r} has rows of length {got}, info.json shape is "
                f"{feat['shape']}{at(bad[:1])}"
            ]
        values, level = pc.list_flatten(values), level + 1
    if level == 0 and int(np.prod(shape)) != 1:
        return [f"{path}: column {name!r} is scalar, info.json shape is {feat['shape']}{at(every)}"]
    want_dtype = np.dtype(bool) if feat["dtype"] == "bool" else np.dtype(feat["dtype"])
    got_dtype = np.dtype(values.type.to_pandas_dtype())
    if got_dtype != want_dtype:
        return [
            f"{path}: column {name!r} has dtype {got_dtype}, info.json says {want_dtype}{at(every)}"
        ]
    if want_dtype.kind == "f" and len(values):
        bad = np.flatnonzero(~pc.is_finite(values).to_numpy(zero_copy_only=False))
        if len(bad):
            row = bad[:1] // max(int(np.prod(shape)), 1)
            return [f"{path}: column {name!r} contains NaN or inf (frame row {row[0]}){at(row)}"]
    return []


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ)


TIMESTAMP_TOLERANCE_S = 1e-4  # LeRobot's tolerance for timestamp == frame_index / fps


def timestamp_problems(path: Path, table: pa.Table, fps: float) -> list[str]:
    """The first frame whose timestamp is not frame_index / fps: LeRobot refuses such a dataset
    when it opens it, and a video decode would return a neighbouring frame for it."""
    timestamp = table["timestamp"].to_numpy()
    frame = table["frame_index"].to_numpy()
    late = np.abs(timestamp - frame / fps) > TIMESTAMP_TOLERANCE_S
    return [
        f"{path}: timestamp {timestamp[r]} is not frame_index / fps ({frame[r]} / {fps}, "
        f"tolerance {TIMESTAMP_TOLERANCE_S} s); in episode {table['episode_index'][r]}, "
        f"frame {frame[r]}"
        for r in np.flatnonzero(late)[:1]
    ]
