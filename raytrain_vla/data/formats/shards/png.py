"""PNG shard images: lossless CHW uint8 <-> PNG bytes, via PyAV (no Pillow dependency).

Encoding lives here; decoding goes through `images.decode_image`, the one image decoder, with
the pixel format that keeps the stored channels.
"""

from __future__ import annotations

import av
import numpy as np

from raytrain_vla.data.formats.images import decode_image
from raytrain_vla.data.formats.lerobot_common import DatasetError

_PIX_FMT = {1: "gray", 3: "rgb24", 4: "rgba"}


def encode_png(images_chw: np.ndarray) -> list[bytes]:
    """Lossless PNG bytes per (C, H, W) uint8 image."""
    n, c, h, w = images_chw.shape
    if c not in _PIX_FMT:
        raise DatasetError(f"PNG shards support 1, 3 or 4 channels, got {c}")
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = w, h, _PIX_FMT[c]
    out = []
    for img in images_chw:
        hwc = img[0] if c == 1 else img.transpose(1, 2, 0)
        packets = ctx.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(hwc), _PIX_FMT[c]))
        out.append(b"".join(bytes(p) for p in packets))
    return out


def decode_png(data: list[bytes], shape: tuple[int, int, int], where: str) -> np.ndarray:
    """(N, C, H, W) uint8 from PNG bytes, each checked against the manifest's CHW `shape`."""
    c, h, w = shape
    out = np.empty((len(data), c, h, w), dtype=np.uint8)
    for i, blob in enumerate(data):
        img = decode_image(blob, f"{where}: PNG image {i}", _PIX_FMT[c])
        if img.size != c * h * w or img.shape[:2] != (h, w):
            raise DatasetError(f"{where}: PNG image {i} does not decode to CHW {list(shape)}")
        out[i] = img.reshape(h, w, c).transpose(2, 0, 1)
    return out
