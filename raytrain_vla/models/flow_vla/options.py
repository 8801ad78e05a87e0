"""`model.flow_vla`: the options of the built-in from-scratch VLA, as the config tree holds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from raytrain_vla.config.families import FamilyOptions
from raytrain_vla.models.flow_vla.presets import SIZE_PRESETS

# A named alias: draccus's field-comment reader (for --help) skips quoted types.
FlowVLASize = Literal["tiny", "small", "base"]


@dataclass(frozen=True)
class FlowVLAOptions(FamilyOptions):
    """`model.flow_vla`: the built-in from-scratch VLA (models/flow_vla)."""

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 8
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "model.size": "model.flow_vla.size",
        "model.max_text_len": "model.flow_vla.max_text_len",
        "model.num_inference_steps": "model.flow_vla.num_inference_steps",
    }

    size: FlowVLASize = "tiny"  # about 3M, 40M and 1B parameters
    num_inference_steps: int = 10  # Euler steps of the flow at inference
    max_text_len: int = 48  # instructions are byte-tokenized; longer ones are an error
    # Each vision-stem conv's stride; empty: the size preset's. Convs past the preset's count
    # keep its last width, so [2, 2, 2, 2] sees 256 px frames as the same 16 x 16 tokens the
    # tiny preset makes of 128 px ones: finer pixels for small goal markers, no more tokens.
    vision_strides: tuple[int, ...] = ()
    # Each vision-stem conv's width; empty: the preset's (as extended by vision_strides). Given,
    # one width per conv: as many as vision_strides, or the preset's conv count.
    vision_channels: tuple[int, ...] = ()
    # Spatial-softmax keypoint tokens per camera, after its grid tokens; 0: none. Each is one
    # learned feature's (x, y), finer than a grid cell (robomimic's and Diffusion Policy's).
    keypoints: int = 0
    # The transformers' width (backbone and action expert d_model, FiLM's conditioning); 0: the
    # preset's. Heads keep the preset's head size, so the width must be a multiple of it.
    width: int = 0

    def check(self, key: str) -> None:
        for name in ("max_text_len", "num_inference_steps"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(
                    f"bad value for '{key}.{name}': {value}, expected a positive integer"
                )
        if any(stride < 1 for stride in self.vision_strides):
            raise ValueError(
                f"bad value for '{key}.vision_strides': {list(self.vision_strides)}, expected "
                "positive integers (or [] for the size preset's)"
            )
        if any(width < 1 for width in self.vision_channels):
            raise ValueError(
                f"bad value for '{key}.vision_channels': {list(self.vision_channels)}, expected "
                "positive integers (or [] for the size preset's)"
            )
        convs = len(self.vision_strides or SIZE_PRESETS[self.size]["vision_strides"])
        if self.vision_channels and len(self.vision_channels) != convs:
            source = f"'{key}.vision_strides'" if self.vision_strides else f"the {self.size} preset"
            raise ValueError(
                f"bad value for '{key}.vision_channels': {list(self.vision_channels)}, expected "
                f"{convs} widths, one per stem conv ({source} has {convs})"
            )
        head_dim = SIZE_PRESETS[self.size]["d_model"] // SIZE_PRESETS[self.size]["num_heads"]
        if self.width < 0 or self.width % head_dim:
            raise ValueError(
                f"bad value for '{key}.width': {self.width}, expected 0 (the preset's) or a "
                f"positive multiple of the {self.size} preset's head size {head_dim}"
            )
        if self.keypoints < 0:
            raise ValueError(
                f"bad value for '{key}.keypoints': {self.keypoints}, expected 0 (none) or a "
                "positive integer"
            )


OPTIONS = FlowVLAOptions  # what models/registry.py registers
