"""Arrow columns as numpy: the one conversion every reader of parquet rows uses.

LeRobot data files, shards and the random-access dataset all store vectors and action chunks
as (nested, fixed-size or variable) list columns whose rows share one length. Flattening them
level by level keeps the conversion in Arrow's buffers, never in Python lists, and
`list_flatten` respects slicing offsets (a list array's `.values` does not).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def to_numpy(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(N, ...) numpy of a scalar or list column whose rows all have one length per level
    (the frame checks and shard manifests ensure it); the dtype is the column's own."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    rows, dims = len(arr), []
    while _is_list(arr.type):
        n = len(arr)
        arr = pc.list_flatten(arr)
        dims.append(len(arr) // n if n else 0)
    out = arr.to_numpy(zero_copy_only=False)
    return out.reshape(rows, *dims) if dims else out
