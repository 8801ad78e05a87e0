"""`model.wall_x`: the options of Wall-OSS (LeRobot 0.6.1's `wall_x`, flow mode), as the config
tree holds them.

Light on purpose (no torch, no transformers): the config loader decodes them on every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from raytrain_vla.config.families import FamilyOptions
from raytrain_vla.models.lerobot_dir import checkpoint_chunk_size

PREDICTION_MODES = ("diffusion",)  # LeRobot's flow matching; FAST needs a remote-code tokenizer


@dataclass(frozen=True)
class WallXOptions(FamilyOptions):
    """`model.wall_x`: Wall-OSS, X Square Robot's VLA (models/wall_x): a Qwen2.5-VL whose MLPs
    route text, image and state tokens to the VLM's expert and the chunk's `<|action|>` tokens
    to an action expert, trained by flow matching.

    Start from a LeRobot `wall_x` checkpoint with `model.init_from=<pretrained_model dir>`, or
    from the base checkpoint alone (`base_path`: a Wall-OSS directory, or a Hugging Face name
    found in the local cache; default `x-square-robot/wall-oss-flow`), whose weights are loaded
    as LeRobot's `WallXPolicy` loads them. Options left empty (None) take the checkpoint's value,
    else LeRobot's default. The state and action are zero-padded to the base's sizes (the sums
    of its `agent_pos_config` and `dof_config`).
    """

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 32
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ()  # base_path may be a hub name: resolved later

    # The base checkpoint (config, tokenizer, image processor, weights): a directory, or a Hugging
    # Face name in the local cache. Empty: the LeRobot checkpoint's `pretrained_name_or_path`,
    # else x-square-robot/wall-oss-flow.
    base_path: str = ""
    # Model camera -> dataset camera. Empty: each model camera reads the dataset camera of the
    # same name (a fresh model takes the dataset's cameras).
    cameras: dict[str, str] = field(default_factory=dict)
    n_action_steps: int | None = None  # actions `select_action` plays per chunk; chunk size
    prediction_mode: str = "diffusion"  # LeRobot's `prediction_mode`; only flow ("diffusion")
    freeze_vision_encoder: bool | None = None  # keep the vision tower frozen; false
    train_action_expert_only: bool | None = None  # train only the action expert and head; false

    def default_chunk_size(self, init_from: str) -> tuple[int, str]:
        """A LeRobot checkpoint's own `chunk_size` (LeRobot fine-tunes with it), else 32."""
        return checkpoint_chunk_size(init_from, self.DEFAULT_CHUNK_SIZE, "LeRobot's wall_x default")

    def check(self, key: str) -> None:
        if self.prediction_mode not in PREDICTION_MODES:
            raise ValueError(
                f"bad value for '{key}.prediction_mode': {self.prediction_mode!r}; only "
                "'diffusion' (flow matching) is built: FAST needs LeRobot's remote-code action "
                "tokenizer from the Hub"
            )
        if self.n_action_steps is not None and self.n_action_steps <= 0:
            raise ValueError(
                f"bad value for '{key}.n_action_steps': {self.n_action_steps}, expected > 0"
            )


OPTIONS = WallXOptions  # what models/registry.py registers
