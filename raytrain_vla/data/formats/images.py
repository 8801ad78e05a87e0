"""Image cells stored inside parquet (LeRobot `dtype: image`, PNG shards): the one decoder.

Decoding uses PyAV's png and mjpeg decoders, already a dependency for video, so no Pillow. PNG
is lossless, so the pixels equal what LeRobot (PIL) returns. A fresh codec context per image:
a reused one hands frames back one call late. `ImageRows` reads only the row groups that hold
the requested frames (through `row_groups`), so a reader never keeps a whole image column,
encoded or decoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import av
import av.error
import numpy as np
import pyarrow as pa

from raytrain_vla.common.location import as_path
from raytrain_vla.data.formats.frame_checks import describe_episodes
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.lerobot_common import inside_root
from raytrain_vla.data.formats.row_groups import group_starts, read_groups

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "mjpeg"))


def decode_image(data: bytes, where: str = "image", pix_fmt: str = "rgb24") -> np.ndarray:
    """One PNG or JPEG -> (H, W, 3) uint8 RGB (grey and alpha are converted, like PIL's RGB);
    another `pix_fmt` ("gray", "rgba") keeps a shard's stored channels."""
    codec = next((c for magic, c in _MAGIC if data.startswith(magic)), None)
    if codec is None:
        raise DatasetError(f"{where}: not a PNG or JPEG image (starts with {data[:8]!r})")
    try:
        ctx = av.CodecContext.create(codec, "r")
        frames = ctx.decode(av.Packet(data)) + ctx.decode(None)
        if not frames:
            raise DatasetError(f"{where}: the {codec} decoder returned no image")
        return frames[0].to_ndarray(format=pix_fmt)
    except (av.error.FFmpegError, ValueError) as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{where}: cannot decode {codec} image ({e})") from e


def decode_images(
    values: pa.Array | pa.ChunkedArray | Iterable[dict | bytes | None],
    where: str = "image column",
    episodes: Sequence[int] | np.ndarray | None = None,
    root: Path | None = None,
) -> np.ndarray:
    """Image cells ({bytes, path} structs or raw bytes) -> (N, H, W, 3) uint8.

    `where` (file and feature) and `episodes` (one per cell) name the culprit in errors. A cell
    with no bytes is read from its `path`, relative to `root` when that is given.
    """
    if isinstance(values, pa.ChunkedArray | pa.Array):
        values = values.to_pylist()
    out: list[np.ndarray] = []
    for i, cell in enumerate(values):
        at = f"{where}, row {i}" + (
            f" ({describe_episodes([episodes[i]])})" if episodes is not None else ""
        )
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        if data is None and isinstance(cell, dict) and cell.get("path"):
            path = (
                Path(cell["path"])
                if root is None
                else inside_root(as_path(root), cell["path"], f"{at}: image path")
            )
            try:
                data = path.read_bytes()
            except OSError as e:
                raise DatasetError(f"{at}: no bytes and cannot read {path} ({e})") from e
        if not isinstance(data, bytes | bytearray):
            raise DatasetError(f"{at}: empty image cell")
        img = decode_image(bytes(data), at)
        if out and img.shape != out[0].shape:
            raise DatasetError(f"{at}: image is {img.shape}, earlier ones are {out[0].shape}")
        out.append(img)
    return np.stack(out) if out else np.zeros((0, 0, 0, 3), np.uint8)


class ImageRows:
    """Image cells by global frame index, read row group by row group from the data files.

    Holds only paths and where each file starts, so it is cheap to pickle; the row-group index
    is `row_groups`' per-process one. The last row group read is kept (per instance), so that
    item-by-item access, as `LeRobotFrames` reads, reads each group once.
    """

    def __init__(self, meta: LeRobotMeta):
        self.root = meta.root
        self.shapes = {k: meta.camera_shape(k) for k in meta.image_keys}
        self.files = [str(path) for path in meta.data_files()]
        rows = [int(group_starts(path)[-1]) for path in self.files]
        self.file_start = np.cumsum([0, *rows[:-1]]).astype(np.int64)
        self._last: tuple | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None}

    def _group(self, key: str, f: int, g: int) -> pa.ChunkedArray:
        if self._last is None or self._last[0] != (key, f, g):
            self._last = ((key, f, g), read_groups(self.files[f], [g], [key])[key])
        return self._last[1]

    def read(self, key: str, ids: np.ndarray, episodes: np.ndarray | None = None) -> np.ndarray:
        """(N, H, W, 3) uint8 images of feature `key` for global frame indices `ids`."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        _, h, w = self.shapes[key]
        out = np.empty((len(ids), h, w, 3), np.uint8)
        file_of = np.searchsorted(self.file_start, ids, side="right") - 1
        for f in np.unique(file_of):
            local = ids - self.file_start[f]
            starts = group_starts(self.files[f])
            group_of = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(group_of[file_of == f]):
                rows = np.flatnonzero((file_of == f) & (group_of == g))
                cells = self._group(key, int(f), int(g)).take(local[rows] - starts[g])
                eps = None if episodes is None else np.asarray(episodes)[rows]
                where = f"{self.files[f]}: feature {key!r}"
                imgs = decode_images(cells, where, eps, self.root)
                if imgs.shape[1:3] != (h, w):
                    raise DatasetError(
                        f"{where}: images are {imgs.shape[1:3]}, info.json says {(h, w)}"
                        + (f"; in {describe_episodes(eps)}" if eps is not None else "")
                    )
                out[rows] = imgs
        return out
