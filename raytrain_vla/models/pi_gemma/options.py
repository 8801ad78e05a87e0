"""`model.pi0` / `model.pi05`: the options of LeRobot's pi0 and pi0.5, as the config tree holds
them (one dataclass; each family's package names its defaults).

Light on purpose (no torch, no transformers): the config loader decodes them on every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from raytrain_vla.config.families import FamilyOptions
from raytrain_vla.models.lerobot_dir import checkpoint_chunk_size

# Architecture options: None takes the `model.init_from` checkpoint's value (read from its
# weights' shapes), else LeRobot's real size (PaliGemma 2B with SigLIP So400m, Gemma 300M).
ARCHITECTURE = (
    "vlm_width", "vlm_mlp_dim", "expert_width", "expert_mlp_dim", "depth", "head_dim",
    "vision_width", "vision_layers", "vision_heads", "vision_mlp_dim", "patch_size",
    "vocab_size", "max_state_dim", "max_action_dim", "image_resolution",
)  # fmt: skip


@dataclass(frozen=True)
class PiOptions(FamilyOptions):
    """LeRobot's pi0 / pi0.5 (models/pi_gemma): a PaliGemma VLM and a Gemma action expert
    attending jointly, layer by layer.

    Start from a LeRobot checkpoint with `model.init_from=<pretrained_model dir>` (its
    architecture, chunk size and normalisation), or build a fresh model from the options.
    The PaliGemma tokenizer is `tokenizer_path`, else a `tokenizer/` folder inside or next to
    the checkpoint, else `google/paligemma-3b-pt-224` in the local Hugging Face cache. Options
    left empty (None) take the checkpoint's value, else LeRobot's default; an architecture option
    that contradicts the checkpoint is an error.
    """

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 50
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ("tokenizer_path",)

    tokenizer_path: str = ""  # a PaliGemma (Gemma) tokenizer directory
    # Model camera -> dataset camera. Empty: each model camera reads the dataset camera of the
    # same name (a fresh model takes the dataset's cameras).
    cameras: dict[str, str] = field(default_factory=dict)
    # Architecture (LeRobot's real size after the ';'); the tiny fixtures use smaller values.
    vlm_width: int | None = None  # Gemma 2B width; 2048
    vlm_mlp_dim: int | None = None  # Gemma 2B MLP; 16384
    expert_width: int | None = None  # action expert width; 1024
    expert_mlp_dim: int | None = None  # action expert MLP; 4096
    depth: int | None = None  # layers of both (they attend jointly, layer by layer); 18
    head_dim: int | None = None  # attention head size of both (8 query heads, 1 KV head); 256
    vision_width: int | None = None  # SigLIP width; 1152
    vision_layers: int | None = None  # SigLIP layers; 27
    vision_heads: int | None = None  # SigLIP heads; 16
    vision_mlp_dim: int | None = None  # SigLIP MLP; 4304
    patch_size: int | None = None  # SigLIP patch; 14
    vocab_size: int | None = None  # PaliGemma vocabulary; 257152
    max_state_dim: int | None = None  # state padded to this size; 32
    max_action_dim: int | None = None  # actions padded to this size; 32
    image_resolution: tuple[int, int] | None = None  # (H, W) images are padded to; (224, 224)
    # Inference and text.
    tokenizer_max_length: int | None = None  # prompt tokens (padded and truncated); 48 / 200
    num_inference_steps: int | None = None  # Euler steps at inference; 10
    n_action_steps: int | None = None  # actions `select_action` plays per chunk; chunk size
    empty_cameras: int | None = None  # extra all-padding camera slots; 0
    # Fine-tuning, as LeRobot's options.
    freeze_vision_encoder: bool | None = None  # keep the SigLIP tower frozen; false
    train_expert_only: bool | None = None  # freeze the whole PaliGemma; false

    def default_chunk_size(self, init_from: str) -> tuple[int, str]:
        """A LeRobot checkpoint's own `chunk_size` (LeRobot fine-tunes with it), else 50."""
        return checkpoint_chunk_size(
            init_from, self.DEFAULT_CHUNK_SIZE, "LeRobot's pi0 / pi0.5 default"
        )

    def check(self, key: str) -> None:
        for name in (*ARCHITECTURE[:-1], "tokenizer_max_length", "num_inference_steps"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"bad value for '{key}.{name}': {value}, expected > 0")
        if self.image_resolution is not None and (
            len(self.image_resolution) != 2 or min(self.image_resolution) <= 0
        ):
            raise ValueError(
                f"bad value for '{key}.image_resolution': {self.image_resolution}, expected (H, W)"
            )
