"""The recipe: every config key that changes the math. Resume compares it, by hash and then key
by key, so a run continues only under the recipe it was started with."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import yaml

from raytrain_vla.config.decode import to_dict
from raytrain_vla.config.schema import Config, ModelConfig

# Keys that may differ between a run and its resume without changing the recipe.
RESUMABLE_KEYS = (
    "ray",
    "logging",
    "eval",
    "debug",
    "train.steps",
    "train.max_consecutive_skipped_updates",
    "train.micro_batch_size",
    "train.activation_checkpointing",
    "train.peak_tflops",
    "train.cpu_offload",
    "train.reshard_after_forward",
    "train.dp_shard",  # DCP reshards between meshes
    "train.frozen_params",  # where frozen weights live, not their values
    "train.async_checkpoint",
    "train.log_interval",
    "train.val_interval",
    "train.save_interval",
    "data.root",
    "data.repo_id",
    "model.truncate_text",  # only decides whether a too-long instruction is refused
    "data.write_demo_if_missing",
    "data.read_tasks_per_segment",
    "data.samples_per_read_task",
    "data.read_tasks_follow_windows",
    "data.read_task_max_mb",
    "data.cache_dir",
    "data.cache_max_gb",
    "data.val_max_samples",
)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def is_resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


def recipe_tree(tree: dict) -> dict:
    """A config tree without the resumable keys, a mixture's locations (its datasets may move
    as data.root may: their fingerprints are compared) and the option sections of the families
    the run does not use."""
    tree = copy.deepcopy(tree)
    for entry in tree.get("data", {}).get("mixture", []):
        entry.pop("root", None)
        entry.pop("repo_id", None)
    model = tree.get("model", {})
    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    for name in list(model):
        if name not in shared and name != model.get("type"):
            model.pop(name)  # another family's options section
    flat = _flatten(tree)
    return {key: value for key, value in flat.items() if not is_resumable(key)}


def recipe_hash(cfg: Config) -> str:
    """Hash over everything that changes the math."""
    recipe = recipe_tree(to_dict(cfg))
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def recipe_differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every recipe key whose value changed between two config trees."""
    a, b = recipe_tree(old), recipe_tree(new)
    return [
        f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}"
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
