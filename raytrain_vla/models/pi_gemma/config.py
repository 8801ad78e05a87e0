"""pi0 / pi0.5's typed config: LeRobot's `PI0Config` / `PI05Config` fields that decide the
numbers, plus the dimensions LeRobot derives from its variant names, frozen.

It is what our `config.json` stores and what a LeRobot `pretrained_model/config.json` maps to and
from (`models/pi_gemma/lerobot_io.py`). The dimensions are explicit so that any size builds
(LeRobot builds only `gemma_2b` + `gemma_300m`; its tiny fixtures patch the dimensions in).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raytrain_vla.models.base import known_fields
from raytrain_vla.models.lerobot_vla import camera_fields, json_safe, shared_config_problems

PI0, PI05 = "pi0", "pi05"
# LeRobot's Gemma variants (openpi's `gemma.get_config`): width, MLP, depth, head size.
GEMMA_VARIANTS = {
    "gemma_2b": {"width": 2048, "mlp_dim": 16_384, "depth": 18, "head_dim": 256},
    "gemma_300m": {"width": 1024, "mlp_dim": 4096, "depth": 18, "head_dim": 256},
}
NUM_HEADS, NUM_KV_HEADS = 8, 1  # both Gemmas; LeRobot's joint layer hard-codes 8 heads
PALIGEMMA_VOCAB = 257_152
# SigLIP So400m/14 as LeRobot builds it (transformers' PaliGemma vision defaults).
SIGLIP = {"width": 1152, "layers": 27, "heads": 16, "mlp_dim": 4304, "patch": 14}
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"  # the name LeRobot's preprocessor writes
DEFAULT_NORM = {
    PI0: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    PI05: {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
}
DEFAULT_TOKENS = {PI0: 48, PI05: 200}


@dataclass(frozen=True)
class PiConfig:
    variant: str = PI0  # "pi0" or "pi05"
    tokenizer_path: str = ""  # the PaliGemma tokenizer's directory
    tokenizer_name: str = PALIGEMMA_TOKENIZER  # as LeRobot's preprocessor names it
    # The model's cameras (LeRobot's image feature keys, in order) and the dataset camera that
    # feeds each ("" = none: a missing camera, see `empty_cameras`).
    cameras: tuple[str, ...] = ()
    camera_sources: tuple[str, ...] = ()
    camera_shapes: tuple[tuple[int, int, int], ...] = ()  # (C, H, W) per camera
    state_dim: int = 8
    action_dim: int = 7
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    image_resolution: tuple[int, int] = (224, 224)
    tokenizer_max_length: int = 48
    empty_cameras: int = 0
    # Dimensions (LeRobot's variants: gemma_2b, gemma_300m, SigLIP So400m).
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    vlm_width: int = 2048
    vlm_mlp_dim: int = 16_384
    expert_width: int = 1024
    expert_mlp_dim: int = 4096
    depth: int = 18
    head_dim: int = 256
    vision_width: int = 1152
    vision_layers: int = 27
    vision_heads: int = 16
    vision_mlp_dim: int = 4304
    patch_size: int = 14
    vocab_size: int = PALIGEMMA_VOCAB
    min_period: float = 4e-3
    max_period: float = 4.0
    freeze_vision_encoder: bool = False
    train_expert_only: bool = False
    norm_map: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NORM[PI0]))
    # LoRA adapters on the Gemma layers (peft): {} is off, else r, alpha, dropout and
    # target_modules (module names inside a layer).
    lora: dict[str, Any] = field(default_factory=dict)
    # LeRobot config keys that do not change the numbers (optimizer presets, hub fields, ...),
    # written back unchanged by a LeRobot-format export.
    lerobot_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = shared_config_problems(self)
        if self.variant not in (PI0, PI05):
            problems.append(f"variant {self.variant!r}, expected pi0/pi05")
        height, width = self.image_resolution
        if height != width or height % self.patch_size:
            problems.append(
                f"image_resolution {self.image_resolution} must be square and a multiple of "
                f"patch_size {self.patch_size} (SigLIP's position table)"
            )
        if self.vision_width % self.vision_heads:
            problems.append(
                f"vision_width {self.vision_width} is not a multiple of vision_heads "
                f"{self.vision_heads}"
            )
        if problems:
            raise ValueError(f"{self.variant} config: " + "; ".join(problems))

    @property
    def adarms(self) -> bool:
        """pi0.5 conditions the expert's norms on the flow time; pi0 feeds it to an MLP."""
        return self.variant == PI05

    @property
    def tokens_per_camera(self) -> int:
        return (self.image_resolution[0] // self.patch_size) ** 2

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PiConfig:
        return cls(**camera_fields(known_fields(cls, d), ("image_resolution",)))
