"""Image resizing for model inputs: uint8 (N, C, H, W) batches in and out, so read tasks ship
bytes, not floats.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_images(images: dict[str, np.ndarray], size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Bilinear (antialiased) resize of uint8 (N, C, H, W) batches to the model's resolution.

    It runs on uint8 directly (torch's vectorised path, rounding like PIL): nine times faster
    than converting to float at 480x640 -> 224, which made the resize, not the video decode,
    the limit of a read task. Strided views (a transposed NHWC decode) are read in place.
    """
    out = {}
    for key, imgs in images.items():
        if tuple(imgs.shape[-2:]) == tuple(size):
            out[key] = imgs
            continue
        x = torch.from_numpy(imgs if imgs.flags.writeable else imgs.copy())
        y = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        out[key] = y.contiguous().numpy()
    return out
