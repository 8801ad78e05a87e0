"""LeRobot's `wall_x` files: the base checkpoint it is built from and its policy directory.

    base/ (x-square-robot/wall-oss-flow or a local copy)
        config.json              flat Qwen2.5-VL-MoE config (text fields at the top level,
                                 `vision_config`, `rope_scaling.mrope_section`, `experts`, ...)
        processor_config.json    the Qwen2-VL image processor (pixel bounds, mean, std)
        tokenizer.json, tokenizer_config.json   Qwen2 BPE with `<|propri|>` and `<|action|>`
        model.safetensors        weights without the policy's `model.` prefix
    pretrained_model/
        config.json              LeRobot's WallXConfig ("type": "wall_x")
        model.safetensors        weights under `model.` (the tied embedding as `model.lm_head`)
        policy_{pre,post}processor*.json / *.safetensors   rename, batch, task, normalizer

Our names map onto LeRobot's by prefix (`to_lerobot_key`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raytrain_vla.models.wall_x.config import CLIP_MEAN, CLIP_STD, WALL_OSS_FLOW

BASE_CONFIG, PROCESSOR_CONFIG = "config.json", "processor_config.json"
BASE_FILES = (BASE_CONFIG, PROCESSOR_CONFIG, "tokenizer.json", "tokenizer_config.json")
# Our top-level prefixes -> LeRobot's policy keys.
_PREFIXES = {
    "visual.": "model.visual.",
    "embed_tokens.": "model.model.embed_tokens.",
    "layers.": "model.model.layers.",
    "norm.": "model.model.norm.",
    "action_head.": "model.action_preprocessor.",
}
EMBED_KEY, LM_HEAD_KEY = "model.model.embed_tokens.weight", "model.lm_head.weight"


def to_lerobot_key(name: str) -> str:
    """Our parameter name -> LeRobot's policy key (a LoRA-wrapped layer's base weight is the
    plain layer's)."""
    name = name.replace(".base_layer.", ".")
    for ours, theirs in _PREFIXES.items():
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    raise ValueError(f"wall_x: no LeRobot key for parameter {name!r}")


def to_base_key(name: str) -> str:
    """Our parameter name -> the base checkpoint's key (the policy's without `model.`)."""
    return to_lerobot_key(name).removeprefix("model.")


def resolve_base(name: str, key: str, policy_dir: Path | None = None) -> Path:
    """The base checkpoint's directory: `name` as a path (also beside or inside `policy_dir`,
    where LeRobot's relative `pretrained_name_or_path` points when run from there), else a
    Hugging Face name already in the local cache. `key` names the option in the error."""
    candidates = [Path(name).expanduser()]
    if policy_dir is not None and not Path(name).is_absolute():
        candidates += [Path(policy_dir) / name, Path(policy_dir).parent / name]
    for path in candidates:
        if (path / BASE_CONFIG).is_file():
            return path.resolve()
    tried = ", ".join(str(p) for p in candidates)
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(name, local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            tried += f", and {name!r} in the local Hugging Face cache"
    raise ValueError(
        f"{key}={name!r}: no Wall-OSS base checkpoint (a directory with {BASE_CONFIG}, "
        f"{PROCESSOR_CONFIG} and the tokenizer) at {tried}; download it first (e.g. "
        f"`huggingface-cli download {WALL_OSS_FLOW}`) or give its directory"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read it as JSON ({err})") from err


def base_fields(base_dir: Path, tokenizer: Any) -> dict[str, Any]:
    """Our config fields from the base checkpoint's `config.json`, `processor_config.json` and
    tokenizer (LeRobot resizes the embedding to the tokenizer's length)."""
    source = base_dir / BASE_CONFIG
    data = _read_json(source)
    try:
        vision = data["vision_config"]
        experts = data["experts"]
        fields = {
            "hidden_size": data["hidden_size"],
            "num_layers": data["num_hidden_layers"],
            "num_heads": data["num_attention_heads"],
            "num_kv_heads": data["num_key_value_heads"],
            "vlm_mlp_dim": experts[0]["intermediate_size"],
            "action_mlp_dim": experts[1]["intermediate_size"],
            "dim_inputs": tuple(data["dim_inputs"]),
            "rope_theta": float(data.get("rope_theta", 1_000_000.0)),
            "mrope_section": tuple(data["rope_scaling"]["mrope_section"]),
            "rms_norm_eps": float(data.get("rms_norm_eps", 1e-6)),
            "vision_depth": vision["depth"],
            "vision_width": vision["hidden_size"],
            "vision_heads": vision["num_heads"],
            "vision_mlp_dim": vision["intermediate_size"],
            "patch_size": vision["patch_size"],
            "temporal_patch_size": vision["temporal_patch_size"],
            "merge_size": vision["spatial_merge_size"],
            "window_size": vision["window_size"],
            "fullatt_block_indexes": tuple(vision["fullatt_block_indexes"]),
            "tokens_per_second": vision.get("tokens_per_second", 2),
            "image_token_id": data["image_token_id"],
            "vision_start_token_id": data["vision_start_token_id"],
            "max_action_dim": sum(data["dof_config"].values()),
            "max_state_dim": sum(data["agent_pos_config"].values()),
        }
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"{source}: not a Wall-OSS (Qwen2.5-VL-MoE) config: no {err}") from err
    if len(experts) != 2 or data.get("mlp_moe") is False or data.get("attention_moe"):
        raise ValueError(
            f"{source}: {len(experts)} experts, mlp_moe={data.get('mlp_moe')}, attention_moe="
            f"{data.get('attention_moe')}; Wall-OSS has 2 MLP experts and shared attention"
        )
    if vision.get("out_hidden_size", data["hidden_size"]) != data["hidden_size"]:
        raise ValueError(f"{source}: vision out_hidden_size differs from hidden_size")
    image = _read_json(base_dir / PROCESSOR_CONFIG).get("image_processor", {})
    size = image.get("size", {})
    fields["min_pixels"] = int(image.get("min_pixels", size.get("shortest_edge", 56 * 56)))
    fields["max_pixels"] = int(image.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280)))
    fields["image_mean"] = tuple(float(v) for v in image.get("image_mean", CLIP_MEAN))
    fields["image_std"] = tuple(float(v) for v in image.get("image_std", CLIP_STD))
    for name in ("patch_size", "merge_size", "temporal_patch_size"):
        theirs = image.get(name)
        if theirs is not None and theirs != fields[name]:
            raise ValueError(
                f"{base_dir / PROCESSOR_CONFIG}: {name} {theirs} differs from the vision "
                f"tower's {fields[name]}"
            )
    ids = {}
    for token in ("<|propri|>", "<|action|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"{base_dir}: the tokenizer has no {token} token (Wall-X's)")
        ids[token] = token_id
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        propri_token_id=ids["<|propri|>"],
        action_token_id=ids["<|action|>"],
        base_extra={k: v for k, v in data.items() if k in ("dof_config", "agent_pos_config")},
    )
    return fields


# LeRobot `WallXConfig` keys our config holds under the same name.
_SHARED = ("chunk_size", "n_action_steps", "max_state_dim", "max_action_dim")
# Keys whose other values change the numbers in ways this implementation does not reproduce.
_REFUSED = {"prediction_mode": "diffusion", "n_obs_steps": 1, "attn_implementation": "eager"}


def config_from_lerobot(
    data: dict[str, Any], policy_dir: Path, base_dir: Path, tokenizer: Any
) -> dict[str, Any]:
    """Our config fields from LeRobot's `config.json` and the base it names (already resolved
    to `base_dir`); cameras map to themselves (or as the preprocessor's rename map says)."""
    from raytrain_vla.models.lerobot_format import read_rename_map

    source = policy_dir / "config.json"
    for key, expected in _REFUSED.items():
        if data.get(key, expected) != expected:
            raise ValueError(
                f"{source}: {key}={data[key]!r} is not supported (expected {expected!r})"
            )
    fields = base_fields(base_dir, tokenizer)
    for key in ("max_state_dim", "max_action_dim"):
        if key in data and data[key] != fields[key]:
            raise ValueError(
                f"{source}: {key}={data[key]} but the base checkpoint {base_dir} pads to "
                f"{fields[key]} (the sum of its {'agent_pos' if 'state' in key else 'dof'}_config)"
            )
    renamed = {new: old for old, new in read_rename_map(policy_dir).items()}
    features = data["input_features"]
    cameras = [k for k, f in features.items() if f["type"] == "VISUAL"]
    state = [f for f in features.values() if f["type"] == "STATE"]
    return {
        **fields,
        **{k: data[k] for k in _SHARED if k in data},
        "base_path": str(base_dir),
        "base_name": data.get("pretrained_name_or_path", WALL_OSS_FLOW),
        "cameras": tuple(cameras),
        "camera_sources": tuple(renamed.get(k, k) for k in cameras),
        "camera_shapes": tuple(tuple(features[k]["shape"]) for k in cameras),
        "state_dim": int(state[0]["shape"][0]) if state else 0,
        "action_dim": int(data["output_features"]["action"]["shape"][0]),
        "norm_map": dict(data["normalization_mapping"]),
        "lerobot_extra": {k: v for k, v in data.items() if k not in _SHARED},
    }


# --- writing LeRobot's files -------------------------------------------------------------------

PRE_STATS = "policy_preprocessor_step_3_normalizer_processor.safetensors"
# LeRobot's `to_bfloat16_for_selected_params`: these stay float32, the rest is bf16.
_FLOAT32_PARTS = (
    "input_layernorm",
    "post_attention_layernorm",
    "model.norm",
    "action_preprocessor",
)
# WallXConfig's other fields at LeRobot's defaults (a fresh export has no template).
_LEROBOT_DEFAULTS: dict[str, Any] = {
    "type": "wall_x", "n_obs_steps": 1, "device": "cpu", "use_amp": False, "use_peft": False,
    "push_to_hub": False, "repo_id": None, "private": None, "tags": None, "license": None,
    "pretrained_path": None, "pretrained_revision": None, "action_tokenizer_path": None,
    "prediction_mode": "diffusion", "attn_implementation": "eager",
    "vision_attn_implementation": "auto", "optimizer_lr": 2e-05, "optimizer_betas": [0.9, 0.95],
    "optimizer_eps": 1e-08, "optimizer_weight_decay": 0.01, "optimizer_grad_clip_norm": 1.0,
    "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 100000, "scheduler_decay_lr": 1e-06,
}  # fmt: skip


def lerobot_dtype(key: str) -> Any:
    """The dtype LeRobot's `WallXPolicy` holds (and saves) the tensor under `key` in."""
    import torch

    return torch.float32 if any(part in key for part in _FLOAT32_PARTS) else torch.bfloat16


def lerobot_state(state: dict[str, Any]) -> dict[str, Any]:
    """Our state dict under LeRobot's keys and dtypes, the tied embedding as `lm_head` only."""
    out = {}
    for name, tensor in state.items():
        key = LM_HEAD_KEY if name == "embed_tokens.weight" else to_lerobot_key(name)
        out[key] = tensor.to(lerobot_dtype(key))
    return out


def config_to_lerobot(config: Any, base_name: str) -> dict[str, Any]:
    """LeRobot's `config.json` for `config` (its own keys, in its order when we read one)."""
    features = {  # the cameras the policy was trained with (LeRobot's wall_x reads them all)
        cam: {"type": "VISUAL", "shape": list(shape)}
        for cam, src, shape in zip(
            config.cameras, config.camera_sources, config.camera_shapes, strict=True
        )
        if src
    }
    features["observation.state"] = {"type": "STATE", "shape": [config.state_dim]}
    ours = {
        **{k: getattr(config, k) for k in _SHARED},
        "type": "wall_x",
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [config.action_dim]}},
        "normalization_mapping": dict(config.norm_map),
        "pretrained_name_or_path": base_name,
    }
    template = dict(config.lerobot_extra) or dict(_LEROBOT_DEFAULTS)
    out = {k: ours.get(k, v) for k, v in template.items()}
    out.update({k: v for k, v in ours.items() if k not in out})
    return json.loads(json.dumps(out))


def processor_files(config: Any, lerobot: dict[str, Any]) -> tuple[dict, dict]:
    """LeRobot's pre/post-processor JSON (`make_wall_x_pre_post_processors`)."""
    from raytrain_vla.models.lerobot_format import device_step, normalizer_step, unnormalizer_step

    features = {**lerobot["input_features"], "action": lerobot["output_features"]["action"]}
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
            {"registry_name": "wall_x_task_processor", "config": {}},
            normalizer_step(features, dict(config.norm_map), PRE_STATS),
            device_step(lerobot.get("device") or "cpu"),
        ],
    }
    post = {
        "name": "policy_postprocessor",
        "steps": [unnormalizer_step(features["action"], dict(config.norm_map)), device_step("cpu")],
    }
    return pre, post


def cached_hub_name(name: str) -> bool:
    """`name` is a Hugging Face repository id in the local cache (LeRobot resolves it there)."""
    if Path(name).expanduser().exists() or name.count("/") != 1:
        return False
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(name, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return False
    return True
