"""Wall-OSS's typed config: the Qwen2.5-VL-MoE architecture of the base checkpoint (its flat
`config.json`, as wall-x writes it), the image processor's pixel bounds, the special token ids,
and LeRobot's `WallXConfig` fields that decide the numbers, frozen.

LeRobot reads every dimension from the base checkpoint (`pretrained_name_or_path`) and the policy
config; we keep them explicit so that any size builds, on the meta device too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raytrain_vla.models.base import known_fields
from raytrain_vla.models.lerobot_vla import camera_fields, json_safe, shared_config_problems

WALL_OSS_FLOW = "x-square-robot/wall-oss-flow"  # LeRobot's default base checkpoint
DEFAULT_NORM = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
# LeRobot's wall_x constants (`constant.py`): the intermediate resize's longer side, the
# 28-aligned resize's bounds, and the prompt's token limit.
RESOLUTION = 256
IMAGE_FACTOR = 28
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
TOKENIZER_MAX_LENGTH = 768
NUM_INFERENCE_STEPS = 10  # LeRobot's Euler steps (hard-coded; `noise_scheduler` is ignored)
# Qwen2.5-VL's image normalisation (CLIP's), the image processor's defaults.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The real Wall-OSS-flow (wall-x's `qwen2_5_moe_flash.json`): what a fresh model builds at.
REAL_SIZE: dict[str, Any] = {
    "hidden_size": 2048, "num_layers": 36, "num_heads": 16, "num_kv_heads": 2,
    "vlm_mlp_dim": 11008, "action_mlp_dim": 2048, "dim_inputs": (2048, 2048),
    "rope_theta": 1_000_000.0, "mrope_section": (16, 24, 24), "rms_norm_eps": 1e-6,
    "vocab_size": 151_936, "vision_depth": 32, "vision_width": 1280, "vision_heads": 16,
    "vision_mlp_dim": 3420, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "window_size": 112, "fullatt_block_indexes": (7, 15, 23, 31), "tokens_per_second": 2,
    "min_pixels": 3136, "max_pixels": 12_845_056,
}  # fmt: skip


@dataclass(frozen=True)
class WallXConfig:
    base_path: str = ""  # the base checkpoint's directory (tokenizer, image processor, config)
    base_name: str = WALL_OSS_FLOW  # as LeRobot's `pretrained_name_or_path` names it
    # The model's cameras (LeRobot's image feature keys, in order) and the dataset camera that
    # feeds each.
    cameras: tuple[str, ...] = ()
    camera_sources: tuple[str, ...] = ()
    camera_shapes: tuple[tuple[int, int, int], ...] = ()  # (C, H, W) per camera
    state_dim: int = 7
    action_dim: int = 7
    chunk_size: int = 32
    n_action_steps: int = 32
    max_state_dim: int = 20
    max_action_dim: int = 20
    # The language model (Qwen2.5-VL text, every MLP a hard-routed pair of experts).
    hidden_size: int = 2048
    num_layers: int = 36
    num_heads: int = 16
    num_kv_heads: int = 2
    vlm_mlp_dim: int = 11008  # expert 0: every token but <|action|>
    action_mlp_dim: int = 2048  # expert 1: the <|action|> tokens
    dim_inputs: tuple[int, int] = (2048, 2048)  # input (and output) width each expert uses
    rope_theta: float = 1_000_000.0
    mrope_section: tuple[int, int, int] = (16, 24, 24)
    rms_norm_eps: float = 1e-6
    vocab_size: int = 151_936
    # The vision tower (Qwen2.5-VL's windowed ViT with a 2x2 patch merger).
    vision_depth: int = 32
    vision_width: int = 1280
    vision_heads: int = 16
    vision_mlp_dim: int = 3420
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    tokens_per_second: int = 2
    # The HF image processor's pixel bounds and normalisation.
    min_pixels: int = 3136
    max_pixels: int = 12_845_056
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    # Special tokens of the base tokenizer.
    pad_token_id: int = 151_643
    image_token_id: int = 151_655
    vision_start_token_id: int = 151_652
    propri_token_id: int = 151_665
    action_token_id: int = 151_666
    num_inference_steps: int = NUM_INFERENCE_STEPS
    freeze_vision_encoder: bool = False
    train_action_expert_only: bool = False
    norm_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NORM))
    # LoRA adapters on the language model (peft-style): {} is off.
    lora: dict[str, Any] = field(default_factory=dict)
    # The base checkpoint's `config.json` keys that do not change the numbers (dof_config,
    # noise_scheduler, ...), and LeRobot policy config keys likewise, written back on export.
    base_extra: dict[str, Any] = field(default_factory=dict)
    lerobot_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = shared_config_problems(self)
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            problems.append(
                f"hidden_size {self.hidden_size}, num_heads {self.num_heads} and num_kv_heads "
                f"{self.num_kv_heads} do not divide"
            )
        if 2 * sum(self.mrope_section) != self.head_dim:
            problems.append(
                f"mrope_section {self.mrope_section} must sum to half the head size {self.head_dim}"
            )
        if max(self.dim_inputs) > self.hidden_size:
            problems.append(f"dim_inputs {self.dim_inputs} exceed hidden_size {self.hidden_size}")
        if self.vision_width % self.vision_heads:
            problems.append(
                f"vision_width {self.vision_width} is not a multiple of vision_heads "
                f"{self.vision_heads}"
            )
        if problems:
            raise ValueError("wall_x config: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_values(self) -> int:
        """Values of one flattened patch (C x temporal x patch x patch)."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WallXConfig:
        data = camera_fields(known_fields(cls, d))
        for key in ("dim_inputs", "mrope_section", "fullatt_block_indexes"):
            if key in data:
                data[key] = tuple(int(v) for v in data[key])
        for key in ("image_mean", "image_std"):
            if key in data:
                data[key] = tuple(float(v) for v in data[key])
        return cls(**data)
