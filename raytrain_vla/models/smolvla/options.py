"""`model.smolvla`: the options of LeRobot's SmolVLA, as the config tree holds them.

Light on purpose (no torch, no transformers): the config loader decodes them on every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from raytrain_vla.config.families import FamilyOptions
from raytrain_vla.models.lerobot_dir import checkpoint_chunk_size

# Choices as named aliases: draccus's field-comment reader (for --help) skips quoted types.
AttentionMode = Literal["cross_attn", "self_attn"]
LanguagePadding = Literal["longest", "max_length"]


@dataclass(frozen=True)
class SmolVLAOptions(FamilyOptions):
    """`model.smolvla`: LeRobot's SmolVLA on a SmolVLM backbone (models/smolvla).

    Start from LeRobot's checkpoint with `model.init_from=<pretrained_model dir>` (its
    architecture, chunk size and VLM directory if `vlm_path` is empty), or from a SmolVLM
    directory (`vlm_path`; its safetensors weights are loaded when present). Options left empty
    (None) take the checkpoint's value, else LeRobot's default; an architecture option that
    contradicts the checkpoint is an error.
    """

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 50
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ("vlm_path",)

    vlm_path: str = ""  # a SmolVLM directory: config, tokenizer, processor (+ weights)
    # Model camera -> dataset camera, e.g. {observation.images.camera1: observation.image}.
    # Empty: each model camera reads the dataset camera of the same name (a fresh model takes
    # the dataset's cameras).
    cameras: dict[str, str] = field(default_factory=dict)
    # Architecture: LeRobot's SmolVLAConfig names, LeRobot's default after the ';'.
    num_vlm_layers: int | None = None  # text layers of the VLM kept; 16
    num_expert_layers: int | None = None  # action expert layers (-1: one per VLM layer); -1
    expert_width_multiplier: float | None = None  # expert width / VLM width; 0.75
    self_attn_every_n_layers: int | None = None  # expert self-attention interleave; 2
    attention_mode: AttentionMode | None = None  # expert attention to the prefix; cross_attn
    max_state_dim: int | None = None  # state padded to this size; 32
    max_action_dim: int | None = None  # actions padded to this size; 32
    # Images resized with padding to (W, H) before the vision tower; (512, 512)
    resize_imgs_with_padding: tuple[int, int] | None = None
    tokenizer_max_length: int | None = None  # instruction tokens kept (LeRobot truncates); 48
    pad_language_to: LanguagePadding | None = None  # token padding; longest
    num_steps: int | None = None  # Euler steps at inference; 10
    empty_cameras: int | None = None  # extra all-padding camera slots; 0
    freeze_vision_encoder: bool | None = None  # keep the vision tower frozen; true
    train_expert_only: bool | None = None  # freeze the whole VLM; true
    train_state_proj: bool | None = None  # train the state projection; true

    def default_chunk_size(self, init_from: str) -> tuple[int, str]:
        """A LeRobot checkpoint's own `chunk_size` (LeRobot fine-tunes with it), else 50."""
        return checkpoint_chunk_size(
            init_from, self.DEFAULT_CHUNK_SIZE, "LeRobot's SmolVLA default"
        )


OPTIONS = SmolVLAOptions  # what models/registry.py registers
