"""LeRobot's per-episode and dataset statistics, as its writer computes them: vectors over frames,
images from per-channel pixel histograms (summable, so the dataset's stats stay exact when
episodes are written one at a time)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def vector_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-feature stats over axis 0 of (N, D) values: min/max/mean/std/count/q*."""
    x = x.astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    out["count"] = np.array([len(x)])
    qs = np.quantile(x, list(QUANTILES.values()), axis=0)
    out.update({name: q for name, q in zip(QUANTILES, qs, strict=True)})
    return out


def histogram(frames: np.ndarray) -> np.ndarray:
    """(3, 256) per-channel pixel counts: summable, so global stats stay exact."""
    pix = frames.reshape(-1, 3).astype(np.int64) + np.array([0, 256, 512])
    return np.bincount(pix.ravel(), minlength=768).reshape(3, 256)


def image_stats(hist: np.ndarray, n_frames: int) -> dict[str, np.ndarray]:
    """Per-channel stats, shaped (3, 1, 1) in [0, 1], exact from (3, 256) pixel histograms."""
    v = np.arange(256) / 255.0
    total = hist.sum(1, keepdims=True)
    mean = (hist * v).sum(1) / total[:, 0]
    std = np.sqrt((hist * (v - mean[:, None]) ** 2).sum(1) / total[:, 0])
    cum = np.cumsum(hist, 1)
    out = {"min": v[(cum > 0).argmax(1)], "max": v[(cum >= total).argmax(1)]}
    out.update(mean=mean, std=std)
    for name, q in QUANTILES.items():  # numpy's default ("linear") quantile of the pixels
        pos = q * (total[:, 0] - 1)
        rank = np.stack([np.floor(pos), np.ceil(pos)], 1)  # (3, 2) sorted-pixel ranks
        lo, hi = v[
            np.stack([np.searchsorted(c, r, side="right") for c, r in zip(cum, rank, strict=True)])
        ].T
        out[name] = lo + (hi - lo) * (pos - rank[:, 0])
    shaped = {k: a.reshape(3, 1, 1) for k, a in out.items()}
    order = ["min", "max", "mean", "std", "count", *QUANTILES]  # LeRobot's column order
    return {k: np.array([n_frames]) if k == "count" else shaped[k] for k in order}


def nested(arr: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """(E, *dims) numpy -> E rows of nested variable-size lists, as LeRobot stores stats."""
    flat = pa.array(arr.reshape(-1), type=dtype)
    for n in reversed(arr.shape[1:]):
        flat = pa.ListArray.from_arrays(
            pa.array(np.arange(0, len(flat) + 1, n, dtype=np.int32)), flat
        )
    return flat
