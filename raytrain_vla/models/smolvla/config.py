"""SmolVLA's typed config: LeRobot's `SmolVLAConfig` fields that decide the numbers, frozen.

It is what our `config.json` stores and what a LeRobot `pretrained_model/config.json` maps to and
from (`models/smolvla/lerobot_io.py`). The SmolVLM config (`vlm_config`) travels inside it, so the
network is rebuilt without the VLM directory; the tokenizer is read from `vlm_path`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raytrain_vla.models.base import known_fields
from raytrain_vla.models.lerobot_vla import camera_fields, json_safe, shared_config_problems


@dataclass(frozen=True)
class SmolVLAConfig:
    vlm_path: str = ""  # SmolVLM directory (config, tokenizer, processor; weights optional)
    vlm_config: dict[str, Any] = field(default_factory=dict)  # its config.json
    vlm_model_name: str = ""  # as written in LeRobot's config (a hub id or a path)
    # The model's cameras (LeRobot's image feature keys, in order) and, for each, the dataset
    # camera that feeds it ("" = none: the camera is missing, see `empty_cameras`).
    cameras: tuple[str, ...] = ()
    camera_sources: tuple[str, ...] = ()
    camera_shapes: tuple[tuple[int, int, int], ...] = ()  # (C, H, W) per camera, as LeRobot's
    state_dim: int = 6
    action_dim: int = 6
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    resize_imgs_with_padding: tuple[int, int] = (512, 512)  # LeRobot's order: (W, H)
    empty_cameras: int = 0
    tokenizer_max_length: int = 48
    pad_language_to: str = "longest"
    num_steps: int = 10
    use_cache: bool = True
    freeze_vision_encoder: bool = True
    train_expert_only: bool = True
    train_state_proj: bool = True
    load_vlm_weights: bool = False
    add_image_special_tokens: bool = False
    attention_mode: str = "cross_attn"
    prefix_length: int = -1
    num_expert_layers: int = -1
    num_vlm_layers: int = 16
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    min_period: float = 4e-3
    max_period: float = 4.0
    norm_map: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    # The VLM half's parameter dtype at inference: LeRobot runs checkpoints that were built with
    # `load_vlm_weights: true` in bfloat16 (it loads the VLM with torch_dtype="bfloat16").
    vlm_dtype: str = "float32"
    # LoRA adapters on the VLM text layers (peft): {} is off, else r, alpha, dropout and
    # target_modules (module names inside a text layer).
    lora: dict[str, Any] = field(default_factory=dict)
    # LeRobot config keys that do not change the numbers (optimizer presets, hub fields, ...),
    # written back unchanged by a LeRobot-format export.
    lerobot_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = shared_config_problems(self)
        if self.attention_mode not in ("cross_attn", "self_attn"):
            problems.append(
                f"attention_mode {self.attention_mode!r}, expected cross_attn/self_attn"
            )
        if self.pad_language_to not in ("longest", "max_length"):
            problems.append(
                f"pad_language_to {self.pad_language_to!r}, expected longest/max_length"
            )
        if self.add_image_special_tokens:
            problems.append("add_image_special_tokens: true is not supported")
        if self.vlm_dtype not in ("float32", "bfloat16"):
            problems.append(f"vlm_dtype {self.vlm_dtype!r}, expected float32/bfloat16")
        if problems:
            raise ValueError("SmolVLA config: " + "; ".join(problems))

    @property
    def text_config(self) -> dict[str, Any]:
        return self.vlm_config["text_config"]

    @property
    def image_hw(self) -> tuple[int, int]:
        """(H, W) images are resized and padded to (LeRobot stores (W, H))."""
        return self.resize_imgs_with_padding[1], self.resize_imgs_with_padding[0]

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SmolVLAConfig:
        return cls(**camera_fields(known_fields(cls, d), ("resize_imgs_with_padding",)))
