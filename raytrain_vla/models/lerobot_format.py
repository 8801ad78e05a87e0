"""LeRobot's policy-directory format as families share it: file names, dataset statistics,
normalisation modes and the preprocessor's rename map (torch and safetensors; the light
`lerobot_dir.py` only recognises a directory)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.models.lerobot_dir import CONFIG, lerobot_config

WEIGHTS = "model.safetensors"
PRE, POST = "policy_preprocessor.json", "policy_postprocessor.json"
POST_STATS = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
NORMALIZER_EPS = 1e-8  # LeRobot's NormalizerProcessorStep default
# Our normaliser's mode for each LeRobot mode (state and action).
MODE_FROM_LEROBOT = {
    "MEAN_STD": "mean_std",
    "MIN_MAX": "min_max",
    "QUANTILES": "quantile",
    "QUANTILE10": "quantile10",
}
MODE_TO_LEROBOT = {v: k for k, v in MODE_FROM_LEROBOT.items()}


def is_lerobot_dir(path: str | Path) -> bool:
    return lerobot_config(path) is not None


def read_stats(policy_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """The postprocessor's statistics as stored (the preprocessor's are the same with visual
    (C,) vectors reshaped to (C, 1, 1))."""
    flat = load_file(str(policy_dir / POST_STATS))
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, tensor in flat.items():
        feature, stat = key.rsplit(".", 1)
        stats.setdefault(feature, {})[stat] = tensor.numpy().astype(np.float32)
    return stats


def normalizer_from_stats(
    stats: dict[str, dict[str, np.ndarray]], norm_map: dict[str, str], source: str
) -> Normalizer:
    """LeRobot's maps as affine ones: mean/std divides by (std + 1e-8), as LeRobot does."""
    modes, shift, scale = {}, {}, {}
    for feature, kind in ((STATE, "STATE"), (ACTION, "ACTION")):
        mode = norm_map.get(kind, "IDENTITY")
        if mode not in MODE_FROM_LEROBOT:
            raise ValueError(f"{source}: normalization {kind}={mode!r} is not supported here")
        if feature not in stats:
            raise ValueError(f"{source}: no statistics for {feature!r}")
        s = stats[feature]
        if mode == "MEAN_STD":
            shift[feature] = s["mean"]
            scale[feature] = (s["std"] + np.float32(NORMALIZER_EPS)).astype(np.float32)
        else:
            lo, hi = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99")}.get(
                mode, ("q10", "q90")
            )
            spread = s[hi] - s[lo]
            shift[feature] = (s[hi] + s[lo]) / 2
            scale[feature] = np.where(spread == 0, NORMALIZER_EPS, spread).astype(np.float32) / 2
        modes[feature] = MODE_FROM_LEROBOT[mode]
    return Normalizer(modes, shift, scale, stats)


def norm_map_for(normalizer: Normalizer) -> dict[str, str]:
    return {
        "VISUAL": "IDENTITY",
        "STATE": MODE_TO_LEROBOT[normalizer.modes[STATE]],
        "ACTION": MODE_TO_LEROBOT[normalizer.modes[ACTION]],
    }


def read_rename_map(policy_dir: Path) -> dict[str, str]:
    """The preprocessor's `rename_map` (dataset key -> the policy's), e.g. a dataset camera
    wired to one of the model's cameras; {} when there is no preprocessor file."""
    try:
        steps = json.loads((policy_dir / PRE).read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return {}
    for step in steps:
        if step.get("registry_name") == "rename_observations_processor":
            return dict(step.get("config", {}).get("rename_map", {}))
    return {}


def flat_stats(stats: dict[str, dict[str, np.ndarray]], visual: set[str]) -> dict:
    flat = {}
    for feature, s in stats.items():
        for stat, value in s.items():
            # A copy: two model cameras fed by one dataset camera share its statistics' arrays,
            # and safetensors refuses tensors that share memory.
            tensor = torch.tensor(np.asarray(value, dtype=np.float32))
            if feature in visual and tensor.ndim == 1:  # LeRobot's _reshape_visual_stats
                tensor = tensor.reshape(-1, 1, 1)
            flat[f"{feature}.{stat}"] = tensor
    return flat


def affine_stats(normalizer: Normalizer, feature: str) -> dict[str, np.ndarray]:
    """Statistics that reproduce a normaliser saved without raw stats (mean/std maps only)."""
    if normalizer.modes[feature] != "mean_std":
        raise ValueError(
            f"the policy's normaliser keeps no raw statistics for {feature!r} and its mode "
            f"{normalizer.modes[feature]!r} cannot be written as LeRobot stats"
        )
    return {"mean": normalizer.shift[feature], "std": normalizer.scale[feature]}


def normalizer_step(features: dict, norm_map: dict[str, str], state_file: str) -> dict:
    """The preprocessor's `normalizer_processor` step."""
    return {
        "registry_name": "normalizer_processor",
        "config": {"eps": NORMALIZER_EPS, "features": features, "norm_map": norm_map},
        "state_file": state_file,
    }


def unnormalizer_step(action_feature: dict, norm_map: dict[str, str]) -> dict:
    """The postprocessor's `unnormalizer_processor` step."""
    return {
        "registry_name": "unnormalizer_processor",
        "config": {
            "eps": NORMALIZER_EPS,
            "features": {ACTION: action_feature},
            "norm_map": norm_map,
        },
        "state_file": POST_STATS,
    }


def tokenizer_step(max_length: int, padding: str, name: str) -> dict:
    """The preprocessor's `tokenizer_processor` step (right padding, truncation)."""
    return {
        "registry_name": "tokenizer_processor",
        "config": {
            "max_length": max_length,
            "task_key": "task",
            "padding_side": "right",
            "padding": padding,
            "truncation": True,
            "tokenizer_name": name,
        },
    }


def device_step(device: str) -> dict:
    return {"registry_name": "device_processor", "config": {"device": device, "float_dtype": None}}


def write_policy_files(
    staging: Path,
    lerobot_state: dict[str, torch.Tensor],
    config_json: dict,
    processors: tuple[dict, dict],
    stats: dict[str, dict[str, np.ndarray]],
    pre_stats_file: str,
) -> None:
    """LeRobot's `pretrained_model/` files into `staging`: weights, config, processor JSON and
    the statistics (visual ones as (C, 1, 1) in the preprocessor's file, as LeRobot keeps them)."""
    save_file({k: v.contiguous() for k, v in lerobot_state.items()}, str(staging / WEIGHTS))
    (staging / CONFIG).write_text(json.dumps(config_json, indent=4))
    pre, post = processors
    (staging / PRE).write_text(json.dumps(pre, indent=2))
    (staging / POST).write_text(json.dumps(post, indent=2))
    visual = {cam for cam in stats if cam.startswith("observation.image")}
    save_file(flat_stats(stats, visual), str(staging / pre_stats_file))
    save_file(flat_stats(stats, set()), str(staging / POST_STATS))


def rename_lerobot_state(
    theirs: dict[str, torch.Tensor], mapping: dict[str, str], source: Path
) -> dict[str, torch.Tensor]:
    """LeRobot's tensors under our names ({ours: theirs} in `mapping`); a key missing from the
    file or not in the model is an error naming the file."""
    missing = sorted(set(mapping.values()) - set(theirs))
    unexpected = sorted(set(theirs) - set(mapping.values()))
    if missing or unexpected:
        raise ValueError(
            f"{source / WEIGHTS}: does not fit the model built from its config.json "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return {ours: theirs[key] for ours, key in mapping.items()}
