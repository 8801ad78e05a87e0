"""Image augmentation keyed to (seed, epoch, sample id), never to the rank or the worker.

The same sample in the same epoch is augmented identically whether it is read by rank 0 of 8
or by a single worker, before or after a resume. Runs inside Ray Data read tasks (CPU nodes).
"""

from __future__ import annotations

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
