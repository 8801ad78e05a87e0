"""Image resizing for model inputs: uint8 (N, C, H, W) batches in and out, so read tasks ship
bytes, not floats.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_images(images: dict[str, np.ndarray], size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Bilinear (antialiased) resize of uint8 (N, C, H, W) batches to the model's resolution."""
    out = {}
    for key, imgs in images.items():
        if tuple(imgs.shape[-2:]) == tuple(size):
            out[key] = imgs
            continue
        x = torch.from_numpy(np.ascontiguousarray(imgs)).float()
        y = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        out[key] = y.round_().clamp_(0, 255).to(torch.uint8).numpy()
    return out
