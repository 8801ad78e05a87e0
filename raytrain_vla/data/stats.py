"""Feature statistics (`meta/stats.json`) computed with Ray Data over the parquet files.

Ray Data reads the files in parallel (on any node with CPUs); the driver reduces per-block
moments exactly and computes exact quantiles from the gathered low-dimensional columns.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import ray

from raytrain_vla.common.atomic import write_text_atomic
from raytrain_vla.data.formats.lerobot import ACTION, DatasetError, LeRobotMeta, read_frames_table

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
SKIP = {"index", "episode_index", "frame_index", "task_index", "timestamp"}


def numeric_features(meta: LeRobotMeta) -> list[str]:
    """Low-dimensional features worth normalising (not cameras, not bookkeeping columns)."""
    out = []
    for key, feat in meta.features.items():
        if key in SKIP or feat.get("dtype") in ("video", "image", "string", "bool"):
            continue
        out.append(key)
    return out


def _as_matrix(values: np.ndarray) -> np.ndarray:
    """A parquet list column arrives as an object array of arrays; make it (N, D) float64."""
    if values.dtype == object:
        values = np.stack([np.asarray(v) for v in values]) if len(values) else np.zeros((0, 1))
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(len(values), -1)


def compute_stats(
    root: str | Path, features: list[str] | None = None
) -> dict[str, dict[str, list]]:
    """mean, std, min, max, count and quantiles per feature over every frame of the dataset."""
    meta = LeRobotMeta.load(root)
    features = features or numeric_features(meta)
    files = sorted({str(meta.data_file(e)) for e in range(meta.num_episodes)})
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    ds = ray.data.read_parquet(files, columns=features)
    chunks: dict[str, list[np.ndarray]] = {f: [] for f in features}
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        for feat in features:
            chunks[feat].append(_as_matrix(batch[feat]))
    stats: dict[str, dict[str, list]] = {}
    for feat in features:
        values = np.concatenate(chunks[feat]) if chunks[feat] else np.zeros((0, 1))
        if len(values) == 0:
            raise DatasetError(f"{meta.root / 'data'}: no rows for feature '{feat}'")
        if not np.isfinite(values).all():
            raise DatasetError(f"{meta.root / 'data'}: feature '{feat}' contains NaN or inf")
        stats[feat] = {k: v.tolist() for k, v in feature_stats(values).items()}
    return stats


def feature_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one feature's (N, D) values: mean, std, min, max, count and
    the quantiles."""
    entry = {
        "mean": values.mean(0),
        "std": values.std(0),
        "min": values.min(0),
        "max": values.max(0),
        "count": np.array([len(values)]),
    }
    entry.update({name: np.quantile(values, q, axis=0) for name, q in QUANTILES.items()})
    return entry


def clipped_action_stats(meta: LeRobotMeta, low: float, high: float) -> dict[str, np.ndarray]:
    """The statistics of every frame's action clipped to [low, high], read from the data files
    (one column): what `data.action_clip` trains on."""
    table = read_frames_table(meta, [ACTION])
    values = np.clip(_as_matrix(table[ACTION].to_numpy(zero_copy_only=False)), low, high)
    return feature_stats(values)


def write_stats(root: str | Path, force: bool = False) -> tuple[Path, bool]:
    """Compute and merge into `meta/stats.json` (other features' entries are kept).

    Returns (path, written). Without `force`, existing stats that already cover every feature
    with all the keys the normalisation modes need are left alone.
    """
    meta = LeRobotMeta.load(root)
    path = meta.root / "meta" / "stats.json"
    features = numeric_features(meta)
    needed = {"mean", "std", "min", "max", *QUANTILES}
    if not force and all(needed <= set(meta.stats.get(f, {})) for f in features):
        return path, False
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update(compute_stats(root, features))
    write_text_atomic(path, json.dumps(merged, indent=2))
    return path, True
