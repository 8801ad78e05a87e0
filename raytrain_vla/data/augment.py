"""Image augmentation keyed to (seed, epoch, sample id), never to the rank or the worker.

The same sample in the same epoch is augmented identically whether it is read by rank 0 of 8
or by a single worker, before or after a resume. Runs inside Ray Data read tasks (CPU nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raytrain_vla.config.schema import AugmentConfig

AUGMENT_STREAM = 0xA06  # keeps augmentation draws apart from any other use of the same seed


def augment_enabled(cfg: AugmentConfig) -> bool:
    return cfg.brightness > 0 or cfg.contrast > 0 or cfg.max_shift_px > 0


def _shift(img: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Translate a CHW image, repeating edge pixels into the uncovered border."""
    _, h, w = img.shape
    ys = np.clip(np.arange(h) - dy, 0, h - 1)
    xs = np.clip(np.arange(w) - dx, 0, w - 1)
    return img[:, ys][:, :, xs]


def augment_images(
    images: dict[str, np.ndarray],
    sample_ids: np.ndarray,
    epochs: np.ndarray,
    seed: int,
    cfg: AugmentConfig,
) -> dict[str, np.ndarray]:
    """Brightness, contrast and a small translation per sample; uint8 (N, C, H, W) in and out.

    All cameras of one sample share one draw, so multi-view geometry stays consistent.
    """
    if not augment_enabled(cfg):
        return images
    out = {k: np.empty_like(v) for k, v in images.items()}
    for i, (sid, epoch) in enumerate(zip(sample_ids, epochs, strict=True)):
        rng = np.random.default_rng([seed, int(epoch), int(sid), AUGMENT_STREAM])
        gain = 1.0 + rng.uniform(-cfg.contrast, cfg.contrast)
        bias = 255.0 * rng.uniform(-cfg.brightness, cfg.brightness)
        dy, dx = rng.integers(-cfg.max_shift_px, cfg.max_shift_px + 1, size=2)
        for key, imgs in images.items():
            img = imgs[i].astype(np.float32)
            mean = img.mean()
            img = (img - mean) * gain + mean + bias
            img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
            out[key][i] = _shift(img, int(dy), int(dx)) if cfg.max_shift_px else img
    return out


def resize_images(images: dict[str, np.ndarray], size: tuple[int, int]) -> dict[str, np.ndarray]:
    """Bilinear (antialiased) resize of uint8 (N, C, H, W) batches to the model's resolution."""
    import torch
    import torch.nn.functional as F

    out = {}
    for key, imgs in images.items():
        if tuple(imgs.shape[-2:]) == tuple(size):
            out[key] = imgs
            continue
        x = torch.from_numpy(np.ascontiguousarray(imgs)).float()
        y = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        out[key] = y.round_().clamp_(0, 255).to(torch.uint8).numpy()
    return out


@dataclass
class ImageOps:
    """What read tasks do to decoded images: resize to the model's size, then augment."""

    size: list[int] = field(default_factory=list)  # [] keeps the source resolution
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0

    def __call__(self, cols: dict[str, np.ndarray], epochs: np.ndarray) -> dict[str, np.ndarray]:
        keys = [k for k in cols if k.startswith("image/")]
        images = {k: cols[k] for k in keys}
        if self.size:
            images = resize_images(images, tuple(self.size))
        images = augment_images(images, cols["sample_id"], epochs, self.seed, self.augment)
        return {**cols, **images}
