"""LeRobot's pi0 / pi0.5 policy directory (`pretrained_model/`), read and written.

    config.json                      LeRobot's PI0Config / PI05Config ("type": "pi0" | "pi05")
    model.safetensors                weights under LeRobot's names ("model.paligemma_with_expert...")
    policy_preprocessor.json         rename, batch, (newline | state prompt), tokenizer, normalizer
    policy_preprocessor_step_<i>_normalizer_processor.safetensors   dataset stats
    policy_postprocessor.json        unnormalizer, absolute actions, device
    policy_postprocessor_step_0_unnormalizer_processor.safetensors  the same stats

LeRobot's config names only variants (`gemma_2b`, `gemma_300m`); the dimensions are read from the
weights' shapes (SigLIP's head count, which no shape shows, is 16 at So400m's width, else the
option `vision_heads`). Our parameter names map one to one onto LeRobot's (`to_lerobot_key`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from raytrain_vla.common.atomic import replacing_directory
from raytrain_vla.common.normalize import ACTION, STATE
from raytrain_vla.models.lerobot_dir import CONFIG
from raytrain_vla.models.lerobot_format import (
    WEIGHTS,
    device_step,
    normalizer_step,
    read_rename_map,
    rename_lerobot_state,
    tokenizer_step,
    unnormalizer_step,
    write_policy_files,
)
from raytrain_vla.models.pi_gemma.config import PI0, PI05, SIGLIP, PiConfig
from raytrain_vla.models.pi_gemma.tokenizer import TOKENIZER_DIR, copy_tokenizer

ROOT = "model.paligemma_with_expert."
VLM = f"{ROOT}paligemma.model."
EXPERT = f"{ROOT}gemma_expert."
# Our top-level prefixes -> LeRobot's (the rest is "model." + our name).
_PREFIXES = {
    "vision.": f"{VLM}vision_tower.vision_model.",
    "projector.": f"{VLM}multi_modal_projector.linear.",
    "embed_tokens.": f"{VLM}language_model.embed_tokens.",
    "vlm_norm.": f"{VLM}language_model.norm.",
    "expert_norm.": f"{EXPERT}model.norm.",
    "lm_heads.vlm.": f"{ROOT}paligemma.lm_head.",
    "lm_heads.expert.": f"{EXPERT}lm_head.",
}
EMBED_KEY, LM_HEAD_KEY = (
    f"{VLM}language_model.embed_tokens.weight",
    f"{ROOT}paligemma.lm_head.weight",
)
# Keys that would change the numbers in ways this implementation does not reproduce.
_REFUSED = {"use_relative_actions": False, "rtc_config": None, "n_obs_steps": 1}
# LeRobot config keys our config holds under the same name.
_SHARED = (
    "chunk_size", "n_action_steps", "max_state_dim", "max_action_dim", "num_inference_steps",
    "tokenizer_max_length", "empty_cameras", "min_period", "max_period", "paligemma_variant",
    "action_expert_variant", "freeze_vision_encoder", "train_expert_only",
)  # fmt: skip


def pre_stats_file(variant: str) -> str:
    """The normaliser is step 6 of pi0's preprocessor and step 3 of pi0.5's."""
    return f"policy_preprocessor_step_{6 if variant == PI0 else 3}_normalizer_processor.safetensors"


def to_lerobot_key(name: str) -> str:
    """Our parameter name -> LeRobot's `model.safetensors` key (a LoRA-wrapped layer's base
    weight is the plain layer's)."""
    name = name.replace(".base_layer.", ".")
    joint = re.match(r"^layers\.(\d+)\.(vlm|expert)\.(.*)$", name)
    if joint:
        depth, half, rest = joint.groups()
        where = f"{VLM}language_model." if half == "vlm" else f"{EXPERT}model."
        return f"{where}layers.{depth}.{rest}"
    for ours, theirs in _PREFIXES.items():
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    return f"model.{name}"


def key_map(model: torch.nn.Module) -> dict[str, str]:
    """{our name: LeRobot key} for every entry of the model's state dict but LoRA adapters."""
    return {name: to_lerobot_key(name) for name in model.state_dict() if ".lora_" not in name}


def weight_shapes(policy_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in `model.safetensors`, read from its header (nothing loaded)."""
    with safe_open(str(policy_dir / WEIGHTS), framework="pt") as f:
        return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}


def architecture_from_weights(
    shapes: dict[str, tuple[int, ...]], source: Path, vision_heads: int | None = None
) -> dict[str, Any]:
    """The dimensions LeRobot's variants stand for, as the checkpoint's tensors have them."""
    layer = f"{VLM}language_model.layers.0."
    try:
        vocab, width = shapes[EMBED_KEY] if EMBED_KEY in shapes else shapes[LM_HEAD_KEY]
        depth = 1 + max(
            int(m.group(1))
            for k in shapes
            if (m := re.match(rf"{re.escape(VLM)}language_model\.layers\.(\d+)\.", k))
        )
        vision_layers = 1 + max(
            int(m.group(1))
            for k in shapes
            if (
                m := re.match(
                    rf"{re.escape(VLM)}vision_tower\.vision_model\.encoder\.layers\.(\d+)\.", k
                )
            )
        )
        patch = shapes[f"{VLM}vision_tower.vision_model.embeddings.patch_embedding.weight"]
        fc1 = shapes[f"{VLM}vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"]
        expert_gate = shapes[f"{EXPERT}model.layers.0.mlp.gate_proj.weight"]
        arch = {
            "vocab_size": vocab,
            "vlm_width": width,
            "depth": depth,
            "vlm_mlp_dim": shapes[f"{layer}mlp.gate_proj.weight"][0],
            "head_dim": shapes[f"{layer}self_attn.k_proj.weight"][0],  # one KV head
            "expert_width": expert_gate[1],
            "expert_mlp_dim": expert_gate[0],
            "vision_width": patch[0],
            "patch_size": patch[2],
            "vision_layers": vision_layers,
            "vision_mlp_dim": fc1[0],
        }
        arch["max_action_dim"] = shapes["model.action_in_proj.weight"][1]
        if "model.state_proj.weight" in shapes:
            arch["max_state_dim"] = shapes["model.state_proj.weight"][1]
    except (KeyError, ValueError) as err:
        raise ValueError(f"{source / WEIGHTS}: not a pi0 / pi0.5 checkpoint ({err})") from err
    if vision_heads is None:
        if arch["vision_width"] != SIGLIP["width"]:
            raise ValueError(
                f"{source / WEIGHTS}: a SigLIP tower of width {arch['vision_width']} (not "
                f"So400m's {SIGLIP['width']}); its head count is not in the weights: give it "
                "with model.<pi0|pi05>.vision_heads (policy.load: options={'vision_heads': N})"
            )
        vision_heads = SIGLIP["heads"]
    arch["vision_heads"] = vision_heads
    return arch


def config_from_lerobot(
    data: dict[str, Any], policy_dir: Path, vision_heads: int | None = None
) -> PiConfig:
    """Our config from LeRobot's `config.json` and the weights' shapes; cameras map to
    themselves (or as the preprocessor's rename map says)."""
    source = policy_dir / CONFIG
    variant = data.get("type")
    if variant not in (PI0, PI05):
        raise ValueError(f"{source}: policy type {variant!r}, expected 'pi0' or 'pi05'")
    for key, expected in _REFUSED.items():
        if data.get(key, expected) != expected:
            raise ValueError(
                f"{source}: {key}={data[key]!r} is not supported (expected {expected!r})"
            )
    arch = architecture_from_weights(weight_shapes(policy_dir), policy_dir, vision_heads)
    renamed = {new: old for old, new in read_rename_map(policy_dir).items()}
    features = data["input_features"]
    cameras = [k for k, f in features.items() if f["type"] == "VISUAL"]
    cameras += [f"observation.images.empty_camera_{i}" for i in range(data.get("empty_cameras", 0))]
    shapes = [tuple(features[k]["shape"]) if k in features else (3, 224, 224) for k in cameras]
    state = [f for f in features.values() if f["type"] == "STATE"]
    shared = {k: data[k] for k in _SHARED if k in data}
    extra = {k: v for k, v in data.items() if k not in _SHARED}
    return PiConfig.from_dict(
        {
            **shared,
            **arch,
            "variant": variant,
            "cameras": cameras,
            "camera_sources": [renamed.get(k, k) if k in features else "" for k in cameras],
            "camera_shapes": shapes,
            "state_dim": int(state[0]["shape"][0]) if state else 0,
            "action_dim": int(data["output_features"][ACTION]["shape"][0]),
            "image_resolution": data.get("image_resolution", (224, 224)),
            "norm_map": dict(data["normalization_mapping"]),
            "lerobot_extra": extra,
        }
    )


def config_to_lerobot(config: PiConfig) -> dict[str, Any]:
    """LeRobot's `config.json` for `config` (its own keys, in its order when we read one)."""
    features = {
        cam: {"type": "VISUAL", "shape": list(shape)}
        for cam, shape in zip(config.cameras, config.camera_shapes, strict=True)
        if not cam.startswith("observation.images.empty_camera_")
    }
    features[STATE] = {"type": "STATE", "shape": [config.state_dim]}
    ours = {
        **{k: getattr(config, k) for k in _SHARED},
        "type": config.variant,
        "input_features": features,
        "output_features": {ACTION: {"type": "ACTION", "shape": [config.action_dim]}},
        "normalization_mapping": dict(config.norm_map),
        "image_resolution": list(config.image_resolution),
        "dtype": "float32",
        "use_relative_actions": False,
    }
    template = dict(config.lerobot_extra) or {"type": config.variant}
    out = {k: ours.get(k, v) for k, v in template.items()}
    out.update({k: v for k, v in ours.items() if k not in out})
    return json.loads(json.dumps(out))  # tuples become lists


def processor_files(config: PiConfig) -> tuple[dict, dict]:
    """LeRobot's pre/post-processor JSON (`make_pi0_pre_post_processors` /
    `make_pi05_pre_post_processors`)."""
    lerobot = config_to_lerobot(config)
    features = {**lerobot["input_features"], ACTION: lerobot["output_features"][ACTION]}
    norm_map = dict(config.norm_map)
    device = config.lerobot_extra.get("device") or "cpu"
    renames = {
        src: cam
        for cam, src in zip(config.cameras, config.camera_sources, strict=True)
        if src and src != cam
    }
    relative = {
        "registry_name": "relative_actions_processor",
        "config": {
            "enabled": False,
            "exclude_joints": list(
                config.lerobot_extra.get("relative_exclude_joints", ["gripper"])
            ),
            "action_names": config.lerobot_extra.get("action_feature_names"),
        },
    }
    normalizer = normalizer_step(features, norm_map, pre_stats_file(config.variant))
    tokenizer = tokenizer_step(config.tokenizer_max_length, "max_length", config.tokenizer_name)
    device = device_step(device)
    head = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": renames}},
        {"registry_name": "to_batch_processor", "config": {}},
    ]
    if config.variant == PI0:
        steps = [
            *head,
            {"registry_name": "pi0_new_line_processor", "config": {}},
            tokenizer, device, relative, normalizer,
        ]  # fmt: skip
    else:
        steps = [
            *head, relative, normalizer,
            {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
            tokenizer, device,
        ]  # fmt: skip
    post = {
        "name": "policy_postprocessor",
        "steps": [
            unnormalizer_step(features[ACTION], norm_map),
            {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
            device_step("cpu"),
        ],
    }
    return {"name": "policy_preprocessor", "steps": steps}, post


def write_lerobot_dir(
    out_dir: Path,
    lerobot_state: dict[str, torch.Tensor],
    config: PiConfig,
    stats: dict[str, dict[str, np.ndarray]],
) -> Path:
    """Written into a staging sibling, then swapped in (nothing half-written is ever visible).
    The tokenizer goes into `tokenizer/` (LeRobot's preprocessor names the hub id)."""
    out_dir = Path(out_dir)
    with replacing_directory(out_dir) as staging:
        processors = processor_files(config)
        write_policy_files(
            staging, lerobot_state, config_to_lerobot(config), processors, stats,
            pre_stats_file(config.variant),
        )  # fmt: skip
        if config.tokenizer_path:
            copy_tokenizer(Path(config.tokenizer_path), staging / TOKENIZER_DIR)
    return out_dir


def lerobot_state(state: dict[str, torch.Tensor], config: PiConfig) -> dict[str, torch.Tensor]:
    """Our state dict under LeRobot's keys."""
    del config
    return {to_lerobot_key(name): tensor for name, tensor in state.items()}


def from_lerobot_state(
    theirs: dict[str, torch.Tensor], mapping: dict[str, str], source: Path
) -> dict[str, torch.Tensor]:
    """LeRobot's tensors under our names. As LeRobot's `from_pretrained`: a checkpoint with the
    PaliGemma LM head but no token embedding (openpi's tied layout) embeds with the head's
    weights; one without the LM head gets the embedding's (the tie)."""
    theirs = dict(theirs)
    if EMBED_KEY not in theirs and LM_HEAD_KEY in theirs:
        theirs[EMBED_KEY] = theirs[LM_HEAD_KEY].clone()
    if LM_HEAD_KEY not in theirs and EMBED_KEY in theirs:
        theirs[LM_HEAD_KEY] = theirs[EMBED_KEY].clone()
    return rename_lerobot_state(theirs, mapping, source)
