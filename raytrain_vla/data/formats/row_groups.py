"""Rows of a parquet file by row number: the one row-group index and its per-process caches.

Every reader that asks a parquet file for rows by number (LeRobot data files, shards, image
features) goes through here. A file's row-group starts and footer are kept per process, keyed
by its content (`file_key`: path, size, version), so the read tasks a process runs neither
re-read a footer (a ranged request, in object storage) nor hold the file open. A read reads
only the row groups that hold its rows. Decoded low-dimensional groups are kept in a
byte-bounded LRU shared by every task the process runs, since neighbouring tasks (and the next
epoch) read the same groups. Image cells (`raw`) are read but never cached: they are large and
each is decoded once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.common.location import file_key, parquet_file
from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot_common import DatasetError

CACHE_BYTES = 256 << 20  # decoded low-dimensional row groups kept per process
INDEXED_FILES = 256  # files whose row-group starts and footer are kept per process
_FILES: OrderedDict[tuple, tuple[np.ndarray, pq.FileMetaData]] = OrderedDict()
_GROUPS: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()
_cached_bytes = 0
_stats = {"hits": 0, "misses": 0}


def _index(key: tuple) -> tuple[np.ndarray, pq.FileMetaData]:
    """(first row of each row group plus the row count, footer) of the file `key` names."""
    if key not in _FILES:
        try:
            md = parquet_file(key[0]).metadata
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{key[0]}: unreadable parquet file ({e})") from e
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        _FILES[key] = (np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), md)
        while len(_FILES) > INDEXED_FILES:
            _FILES.popitem(last=False)
    _FILES.move_to_end(key)
    return _FILES[key]


def group_starts(path: str) -> np.ndarray:
    """The first row of each row group of `path`, then its row count (cached per process)."""
    return _index(file_key(path))[0]


def _read_groups(key: tuple, groups: list[int], columns: list[str]) -> pa.Table:
    path, (_, md) = key[0], _index(key)
    try:  # with the cached footer, opening the file reads nothing more
        pf = parquet_file(path, memory_map=True, metadata=md)
        return pf.read_row_groups(groups, columns=columns)
    except (OSError, pa.ArrowException, KeyError) as e:
        raise DatasetError(f"{path}: cannot read columns {columns} ({e})") from e


def read_groups(path: str, groups: list[int], columns: list[str]) -> pa.Table:
    """`columns` of row groups `groups` of `path`, uncached (image cells)."""
    return _read_groups(file_key(path), groups, columns)


def _cached_group(key: tuple, group: int, columns: list[str]) -> dict[str, np.ndarray]:
    global _cached_bytes
    ckey = (key, group, tuple(columns))
    if ckey in _GROUPS:
        _stats["hits"] += 1
        _GROUPS.move_to_end(ckey)
        return _GROUPS[ckey]
    _stats["misses"] += 1
    table = _read_groups(key, [group], columns)
    values = {c: to_numpy(table[c]) for c in columns}
    _GROUPS[ckey] = values
    _cached_bytes += sum(v.nbytes for v in values.values())
    while _cached_bytes > CACHE_BYTES and len(_GROUPS) > 1:
        _cached_bytes -= sum(v.nbytes for v in _GROUPS.popitem(last=False)[1].values())
    return values


def read_rows(
    path: str, rows: np.ndarray, columns: list[str], raw: bool = False
) -> dict[str, np.ndarray | pa.ChunkedArray]:
    """`columns` at `rows` (any order, repeats allowed): numpy arrays from the group cache, or,
    when `raw`, arrow arrays read for this call only (image cells, whole shard rows)."""
    rows = np.asarray(rows, dtype=np.int64)
    key = file_key(path)
    starts = _index(key)[0]
    if len(rows) and (rows.min() < 0 or rows.max() >= starts[-1]):
        raise DatasetError(f"{path}: rows outside 0..{starts[-1] - 1}; the file changed?")
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    if raw:
        table = _read_groups(key, groups.tolist(), columns)
        sizes = starts[groups + 1] - starts[groups]
        first = np.cumsum(sizes) - sizes  # where each read group starts in `table`
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
