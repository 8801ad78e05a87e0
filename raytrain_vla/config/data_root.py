"""Where a run's dataset lives: the demo by name, a LeRobot cache entry by `repo_id`, or a path.

Kept free of heavy imports: the config loader resolves `data.root` with it before Ray starts, and
a path that does not exist is refused here rather than silently replaced by the demo dataset.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

DEMO = "demo"  # `data.root=demo`: the built-in demo dataset, written on first use
DEMO_CACHE = Path("~/.cache/raytrain_vla")
DEMO_DEFAULTS = (1500, 0)  # (episodes, seed) of `demo_v1`, the root of every earlier run
DATASET_MARKERS = ("meta/info.json", "shards.json")  # a LeRobot root, or a shards directory


def demo_root(episodes: int, seed: int) -> Path:
    """One directory per (episodes, seed): a changed `data.demo_episodes` is never ignored."""
    name = "demo_v1" if (episodes, seed) == DEMO_DEFAULTS else f"demo_v1_{episodes}ep_seed{seed}"
    return (DEMO_CACHE / name).expanduser().resolve()


def lerobot_home() -> Path:
    """LeRobot's local dataset cache, found as LeRobot finds it (HF_LEROBOT_HOME, else
    HF_HOME/lerobot, else ~/.cache/huggingface/lerobot)."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or "~/.cache/huggingface"
    return Path(hf_home).expanduser() / "lerobot"


def repo_root(repo_id: str) -> Path:
    return (lerobot_home() / repo_id).resolve()


def is_dataset(root) -> bool:
    """`root` (a Path, or a UPath on an object store) holds a LeRobot dataset or shards."""
    return any((root / marker).is_file() for marker in DATASET_MARKERS)


def nearest_existing(path: Path) -> str:
    """`'/data/robot_data'` for a typo'd `/data/robot_dta`: the closest name next to the first
    missing part of the path, or the deepest directory that exists."""
    path = path.expanduser().absolute()
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    parent = missing.parent
    try:
        siblings = sorted(p.name for p in parent.iterdir() if not p.name.startswith("."))
    except OSError:
        siblings = []
    close = difflib.get_close_matches(missing.name, siblings, n=1, cutoff=0.6)
    return str(parent / close[0]) if close else f"{parent} (exists; no similar name in it)"
