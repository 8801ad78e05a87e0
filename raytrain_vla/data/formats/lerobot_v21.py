"""LeRobot v2.1 metadata: jsonl files, one parquet and one mp4 per episode.

The loader fills the same per-episode columns as v3.0 (`data/chunk_index`, `data/file_index`,
`videos/<key>/from_timestamp`, ...), with the episode as its own file and every video starting
at t = 0, so `LeRobotMeta` and everything downstream never ask which version they read.
Stats come from `meta/stats.json` when present, else are aggregated from the per-episode
stats exactly as LeRobot's `aggregate_stats` does (count-weighted mean, pooled variance).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from raytrain_vla.data.formats.lerobot_common import (
    DatasetError,
    check_episodes,
    check_features,
    load_stats_json,
)


def _read_jsonl(path: Path, what: str) -> list[dict]:
    """One JSON object per line (LeRobot v2.1 metadata); blank lines are ignored."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; expected {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable ({e}); expected {what}") from e
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise DatasetError(f"{path}, line {n}: not valid JSON ({e})") from e
            if not isinstance(rows[-1], dict):
                raise DatasetError(f"{path}, line {n}: expected a JSON object with {what}")
    return rows


def load_v21(
    root: Path, info: dict
) -> tuple[list[str], dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """v2.1: jsonl metadata, one parquet and one mp4 per episode, chunked by `chunks_size`.

    Returns what `LeRobotMeta` holds besides root and info: tasks, episode columns, stats."""
    videos = check_features(root, info)
    tasks_path = root / "meta" / "tasks.jsonl"
    rows = _read_jsonl(tasks_path, "'task_index' and 'task'")
    try:
        by_index = {int(r["task_index"]): str(r["task"]) for r in rows}
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{tasks_path}: every line needs 'task_index' and 'task'") from None
    if sorted(by_index) != list(range(len(rows))):
        raise DatasetError(f"{tasks_path}: task_index is not 0..{len(rows) - 1}")
    tasks = [by_index[i] for i in range(len(rows))]

    ep_path = root / "meta" / "episodes.jsonl"
    rows = _read_jsonl(ep_path, "'episode_index', 'tasks' and 'length'")
    try:
        rows.sort(key=lambda r: int(r["episode_index"]))
        idx = np.array([int(r["episode_index"]) for r in rows], dtype=np.int64)
        length = np.array([int(r["length"]) for r in rows], dtype=np.int64)
        ep_tasks = [[str(t) for t in r["tasks"]] for r in rows]
    except (KeyError, TypeError, ValueError):
        raise DatasetError(
            f"{ep_path}: every line needs 'episode_index', 'tasks', 'length'"
        ) from None
    chunk = idx // max(int(info.get("chunks_size", 1000)), 1)
    to_index = np.cumsum(length)
    eps = {
        "episode_index": idx,
        "length": length,
        "data/chunk_index": chunk,
        "data/file_index": idx,
    }
    eps.update(dataset_from_index=to_index - length, dataset_to_index=to_index)
    eps["tasks"] = np.empty(len(rows), dtype=object)
    eps["tasks"][:] = ep_tasks
    for k in videos:  # one video per episode, starting at t = 0
        eps.update({f"videos/{k}/chunk_index": chunk, f"videos/{k}/file_index": idx})
        eps[f"videos/{k}/from_timestamp"] = np.zeros(len(rows))
        eps[f"videos/{k}/to_timestamp"] = length / float(info["fps"])
    check_episodes(ep_path, info, eps)
    stats = load_stats_json(root) or aggregate_episodes_stats(
        root / "meta" / "episodes_stats.jsonl"
    )
    return tasks, eps, stats


def aggregate_episodes_stats(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Global stats from `episodes_stats.jsonl` ({} when the file is absent)."""
    if not path.exists():
        return {}
    per_feature: dict[str, list[dict[str, np.ndarray]]] = {}
    for n, row in enumerate(_read_jsonl(path, "'episode_index' and 'stats'"), 1):
        if not isinstance(row.get("stats"), dict):
            raise DatasetError(f"{path}, line {n}: no 'stats' object")
        for key, st in row["stats"].items():
            missing = [s for s in ("min", "max", "mean", "std", "count") if s not in st]
            if missing:
                raise DatasetError(
                    f"{path}: episode {row.get('episode_index')} feature {key!r} lacks {missing}"
                )
            per_feature.setdefault(key, []).append({s: np.asarray(v) for s, v in st.items()})
    out = {}
    for key, parts in per_feature.items():
        try:
            out[key] = aggregate_stats(parts)
        except ValueError as e:  # per-episode arrays of different shapes
            raise DatasetError(
                f"{path}: feature {key!r} stats disagree across episodes ({e})"
            ) from e
    return out


def aggregate_stats(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-episode stats of one feature -> global: count-weighted mean, pooled variance."""
    means = np.stack([p["mean"] for p in parts]).astype(np.float64)
    counts = np.array([float(np.sum(p["count"])) for p in parts])
    weight = counts.reshape(-1, *[1] * (means.ndim - 1))
    total = counts.sum()
    mean = (means * weight).sum(0) / total
    var = np.stack([p["std"] for p in parts]).astype(np.float64) ** 2
    var = ((var + (means - mean) ** 2) * weight).sum(0) / total
    return {
        "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
        "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(total)]),
    }
