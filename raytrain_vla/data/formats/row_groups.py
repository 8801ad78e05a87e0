"""Rows of a parquet file by row number, read row group by row group and cached per process.

A read task asks for the rows of its own samples. It reads only the row groups that hold them,
and keeps decoded low-dimensional groups in a byte-bounded LRU shared by every task the process
runs, since neighbouring tasks (and the next epoch) read the same groups. Image cells (`raw`)
are read but never cached: they are large and each is decoded once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raytrain_vla.common.location import file_key, parquet_file
from raytrain_vla.data.formats.lerobot_common import DatasetError

CACHE_BYTES = 256 << 20  # decoded low-dimensional row groups kept per process
_FILES: OrderedDict[tuple, np.ndarray] = OrderedDict()  # (path, mtime, size) -> group starts
_GROUPS: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()
_cached_bytes = 0
_stats = {"hits": 0, "misses": 0}


def _group_starts(key: tuple) -> np.ndarray:
    if key not in _FILES:
        try:
            md = parquet_file(key[0]).metadata
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{key[0]}: unreadable parquet file ({e})") from e
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        _FILES[key] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        while len(_FILES) > 256:
            _FILES.popitem(last=False)
    _FILES.move_to_end(key)
    return _FILES[key]


def to_numpy(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(N, ...) numpy of a scalar or list column whose rows all have one length (checked at
    open), without going through Python lists."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    dims = []
    while (
        pa.types.is_fixed_size_list(arr.type)
        or pa.types.is_list(arr.type)
        or (pa.types.is_large_list(arr.type))
    ):
        n = len(arr)
        arr = pc.list_flatten(arr)
        dims.append(len(arr) // n if n else 0)
    out = arr.to_numpy(zero_copy_only=False)
    return out.reshape(-1, *dims) if dims else out


def _read_groups(path: str, groups: list[int], columns: list[str]) -> pa.Table:
    try:
        return parquet_file(path).read_row_groups(groups, columns=columns)
    except (OSError, pa.ArrowException, KeyError) as e:
        raise DatasetError(f"{path}: cannot read columns {columns} ({e})") from e


def _cached_group(key: tuple, group: int, columns: list[str]) -> dict[str, np.ndarray]:
    global _cached_bytes
    ckey = (key, group, tuple(columns))
    if ckey in _GROUPS:
        _stats["hits"] += 1
        _GROUPS.move_to_end(ckey)
        return _GROUPS[ckey]
    _stats["misses"] += 1
    table = _read_groups(key[0], [group], columns)
    values = {c: to_numpy(table[c]) for c in columns}
    _GROUPS[ckey] = values
    _cached_bytes += sum(v.nbytes for v in values.values())
    while _cached_bytes > CACHE_BYTES and len(_GROUPS) > 1:
        _cached_bytes -= sum(v.nbytes for v in _GROUPS.popitem(last=False)[1].values())
    return values


def read_rows(
    path: str, rows: np.ndarray, columns: list[str], raw: bool = False
) -> dict[str, np.ndarray | pa.Array]:
    """`columns` at `rows` (any order, repeats allowed): numpy arrays, or arrow arrays when
    `raw` (image cells, uncached)."""
    rows = np.asarray(rows, dtype=np.int64)
    key = file_key(path)
    starts = _group_starts(key)
    if len(rows) and (rows.min() < 0 or rows.max() >= starts[-1]):
        raise DatasetError(f"{path}: rows outside 0..{starts[-1] - 1}; the file changed?")
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    if raw:
        table = _read_groups(path, groups.tolist(), columns)
        sizes = starts[groups + 1] - starts[groups]
        first = np.cumsum(sizes) - sizes
        local = first[np.searchsorted(groups, group_of)] + rows - starts[group_of]
        taken = table.take(pa.array(local))
        return {c: taken[c] for c in columns}
    out: dict[str, np.ndarray] = {}
    for g in groups:
        sel = np.flatnonzero(group_of == g)
        values = _cached_group(key, int(g), columns)
        for c in columns:
            if c not in out:
                out[c] = np.empty((len(rows), *values[c].shape[1:]), values[c].dtype)
            out[c][sel] = values[c][rows[sel] - starts[g]]
    return out


def cache_stats() -> dict[str, int]:
    """Row-group cache hits and misses in this process, and the bytes it holds."""
    return {**_stats, "bytes": _cached_bytes}
