"""LeRobot's SmolVLA policy directory (`pretrained_model/`), read and written.

    config.json                      LeRobot's SmolVLAConfig (draccus JSON, "type": "smolvla")
    model.safetensors                weights under LeRobot's names ("model.vlm_with_expert...")
    policy_preprocessor.json         rename, batch, newline, tokenizer, device, normalizer steps
    policy_preprocessor_step_5_normalizer_processor.safetensors     dataset stats "<feature>.<stat>"
    policy_postprocessor.json        unnormalizer, device steps
    policy_postprocessor_step_0_unnormalizer_processor.safetensors  the same stats

Our parameter names map one to one onto LeRobot's (`to_lerobot_key`); the statistics travel in
`Normalizer.stats`, so a LeRobot directory read and written again is equal tensor for tensor.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raytrain_vla.common.atomic import replacing_directory
from raytrain_vla.common.normalize import ACTION, STATE
from raytrain_vla.models.lerobot_dir import CONFIG
from raytrain_vla.models.lerobot_format import (  # noqa: F401 (smolvla's callers)
    NORMALIZER_EPS,
    POST,
    POST_STATS,
    PRE,
    WEIGHTS,
    device_step,
    is_lerobot_dir,
    norm_map_for,
    normalizer_from_stats,
    normalizer_step,
    read_rename_map,
    read_stats,
    tokenizer_step,
    unnormalizer_step,
    write_policy_files,
)
from raytrain_vla.models.smolvla.config import SmolVLAConfig
from raytrain_vla.models.smolvla.model import expert_layer_index

PRE_STATS = "policy_preprocessor_step_5_normalizer_processor.safetensors"
# LeRobot config keys our config holds under the same name.
_SHARED = [
    f.name
    for f in dataclasses.fields(SmolVLAConfig)
    if f.name
    not in {
        "vlm_path", "vlm_config", "cameras", "camera_sources", "camera_shapes", "state_dim",
        "action_dim", "norm_map", "vlm_dtype", "lerobot_extra", "vlm_model_name", "lora",
    }
]  # fmt: skip
# Keys that would change the numbers in ways this implementation does not reproduce.
_REFUSED = {
    "adapt_to_pi_aloha": False,
    "use_delta_joint_actions_aloha": False,
    "rtc_config": None,
    "n_obs_steps": 1,
}


def resolve_vlm(name: str, policy_dir: Path) -> Path:
    """LeRobot resolves a relative `vlm_model_name` against the working directory; failing
    that we look inside and next to the policy directory, then in the Hugging Face cache (a
    hub id downloaded before; nothing is fetched)."""
    for candidate in (Path(name).expanduser(), policy_dir / name, policy_dir.parent / name):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=name, local_files_only=True))
    except Exception:  # not a hub id, or not in the cache: say where we looked
        pass
    raise FileNotFoundError(
        f"{policy_dir / CONFIG}: vlm_model_name {name!r} is not a local directory (looked in the "
        f"working directory, in {policy_dir} and next to it); download it first, e.g. "
        f"`huggingface-cli download {name} --local-dir DIR`, and set model.smolvla.vlm_path=DIR"
    )


def config_from_lerobot(
    data: dict[str, Any], policy_dir: Path, vlm_path: str | Path | None = None
) -> SmolVLAConfig:
    """Our config from LeRobot's `config.json`; cameras map to themselves."""
    source = policy_dir / CONFIG
    if data.get("type") != "smolvla":
        raise ValueError(f"{source}: policy type {data.get('type')!r}, expected 'smolvla'")
    for key, expected in _REFUSED.items():
        if data.get(key, expected) != expected:
            raise ValueError(
                f"{source}: {key}={data[key]!r} is not supported (expected {expected!r})"
            )
    vlm_dir = Path(vlm_path) if vlm_path else resolve_vlm(data["vlm_model_name"], policy_dir)
    renamed = {new: old for old, new in read_rename_map(policy_dir).items()}
    vlm_config = json.loads((Path(vlm_dir) / "config.json").read_text())
    features = data["input_features"]
    cameras = [k for k, f in features.items() if f["type"] == "VISUAL"]
    cameras += [f"observation.images.empty_camera_{i}" for i in range(data.get("empty_cameras", 0))]
    shapes = [tuple(features[k]["shape"]) if k in features else (3, 480, 640) for k in cameras]
    state = [f for f in features.values() if f["type"] == "STATE"]
    action = data["output_features"][ACTION]
    shared = {k: data[k] for k in _SHARED if k in data}
    extra = {k: v for k, v in data.items() if k not in _SHARED and k != "vlm_model_name"}
    weights_in_vlm = bool(data.get("load_vlm_weights", False))
    return SmolVLAConfig.from_dict(
        {
            **shared,
            "vlm_path": str(vlm_dir),
            "vlm_config": vlm_config,
            "vlm_model_name": data["vlm_model_name"],
            "cameras": cameras,
            "camera_sources": [renamed.get(k, k) if k in features else "" for k in cameras],
            "camera_shapes": shapes,
            "state_dim": int(state[0]["shape"][0]) if state else 0,
            "action_dim": int(action["shape"][0]),
            "norm_map": dict(data["normalization_mapping"]),
            "vlm_dtype": "bfloat16" if weights_in_vlm else "float32",
            "lerobot_extra": extra,
        }
    )


def config_to_lerobot(config: SmolVLAConfig) -> dict[str, Any]:
    """LeRobot's `config.json` for `config` (its own keys, in its order when we read one)."""
    shared = {k: getattr(config, k) for k in _SHARED}
    features = {
        cam: {"type": "VISUAL", "shape": list(shape)}
        for cam, shape in zip(config.cameras, config.camera_shapes, strict=True)
        if not cam.startswith("observation.images.empty_camera_")
    }
    features[STATE] = {"type": "STATE", "shape": [config.state_dim]}
    ours = {
        **shared,
        "type": "smolvla",
        "input_features": features,
        "output_features": {ACTION: {"type": "ACTION", "shape": [config.action_dim]}},
        "normalization_mapping": dict(config.norm_map),
        "vlm_model_name": config.vlm_model_name or config.vlm_path,
        "resize_imgs_with_padding": list(config.resize_imgs_with_padding),
    }
    template = dict(config.lerobot_extra) or {"type": "smolvla"}
    out = {k: ours.get(k, v) for k, v in template.items()}
    out.update({k: v for k, v in ours.items() if k not in out})
    return json.loads(json.dumps(out))  # tuples become lists


def to_lerobot_key(name: str, config: SmolVLAConfig, num_expert_layers: int) -> str:
    """Our parameter name -> LeRobot's `model.safetensors` key (a LoRA-wrapped layer's base
    weight is the plain layer's)."""
    name = name.replace(".base_layer.", ".")
    joint = re.match(r"^layers\.(\d+)\.(vlm|expert)\.(.*)$", name)
    if joint:
        depth, half, rest = int(joint.group(1)), joint.group(2), joint.group(3)
        if half == "vlm":
            return f"model.vlm_with_expert.vlm.model.text_model.layers.{depth}.{rest}"
        index = expert_layer_index(config, depth, num_expert_layers)
        return f"model.vlm_with_expert.lm_expert.layers.{index}.{rest}"
    if name.startswith(("vlm.", "lm_expert.")):
        return f"model.vlm_with_expert.{name}"
    return f"model.{name}"


def key_map(model: torch.nn.Module, config: SmolVLAConfig) -> dict[str, str]:
    """{our name: LeRobot key} for every entry of the model's state dict but LoRA adapters."""
    experts = sum(layer.expert is not None for layer in model.layers)
    return {
        name: to_lerobot_key(name, config, experts)
        for name in model.state_dict()
        if ".lora_" not in name
    }


def _features(config: SmolVLAConfig) -> dict[str, Any]:
    return config_to_lerobot(config)["input_features"]


def processor_files(config: SmolVLAConfig) -> tuple[dict, dict]:
    """LeRobot's pre/post-processor JSON for `config` (`make_smolvla_pre_post_processors`)."""
    features = {**_features(config), ACTION: {"type": "ACTION", "shape": [config.action_dim]}}
    norm_map = dict(config.norm_map)
    device = config.lerobot_extra.get("device") or "cpu"
    renames = {
        src: cam
        for cam, src in zip(config.cameras, config.camera_sources, strict=True)
        if src and src != cam
    }
    pre = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": renames}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "smolvla_new_line_processor", "config": {}},
            tokenizer_step(
                config.tokenizer_max_length,
                config.pad_language_to,
                config.vlm_model_name or config.vlm_path,
            ),
            device_step(device),
            normalizer_step(features, norm_map, PRE_STATS),
        ],
    }
    post = {
        "name": "policy_postprocessor",
        "steps": [unnormalizer_step(features[ACTION], norm_map), device_step("cpu")],
    }
    return pre, post


def write_lerobot_dir(
    out_dir: Path,
    lerobot_state: dict[str, torch.Tensor],
    config: SmolVLAConfig,
    stats: dict[str, dict[str, np.ndarray]],
) -> Path:
    """Written into a staging sibling, then swapped in (nothing half-written is ever visible)."""
    out_dir = Path(out_dir)
    with replacing_directory(out_dir) as staging:
        processors = processor_files(config)
        write_policy_files(
            staging, lerobot_state, config_to_lerobot(config), processors, stats, PRE_STATS
        )
        name = config.vlm_model_name or config.vlm_path
        if not Path(name).is_absolute() and Path(config.vlm_path).is_dir():
            # A relative VLM path: its config and tokenizer (no weights) go inside, where
            # `policy.load` looks; LeRobot finds them when run from the directory.
            copy_vlm_assets(Path(config.vlm_path), staging / name)
    return out_dir


VLM_ASSETS = re.compile(r".*\.(json|jinja|txt|model)$")  # config, tokenizer, processor files


def copy_vlm_assets(vlm_dir: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in vlm_dir.iterdir():
        if file.is_file() and VLM_ASSETS.match(file.name):
            shutil.copy2(file, target / file.name)
