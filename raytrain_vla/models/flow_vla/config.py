"""flow_vla's typed config: the `model.flow_vla` options resolved against the dataset's shapes.

Frozen, and what an exported policy's `config.json` stores (`to_dict`), so the model is rebuilt
from it alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.base import config_to_dict, known_fields
from raytrain_vla.models.flow_vla.options import FlowVLAOptions
from raytrain_vla.models.flow_vla.presets import SIZE_PRESETS


@dataclass(frozen=True)
class FlowVLAConfig:
    camera_keys: tuple[str, ...] = ("observation.image",)
    image_size: tuple[int, int] = (32, 32)
    state_dim: int = 2
    action_dim: int = 2
    chunk_size: int = 8
    size: str = "tiny"
    d_model: int = 64
    num_heads: int = 2
    backbone_layers: int = 2
    expert_d_model: int = 64
    expert_heads: int = 2
    expert_layers: int = 2
    mlp_ratio: float = 4.0
    vision_channels: tuple[int, ...] = (32, 32, 32)
    vision_strides: tuple[int, ...] = (2, 2, 2)
    film_dim: int = 64
    keypoints: int = 0  # spatial-softmax keypoint tokens per camera (model.flow_vla.keypoints)
    max_text_len: int = 48
    num_inference_steps: int = 10

    @classmethod
    def from_size(cls, size: str, **kwargs: Any) -> FlowVLAConfig:
        """Preset dims for ``size``; kwargs give the data shapes (and may override any dim)."""
        if size not in SIZE_PRESETS:
            raise ValueError(f"unknown flow_vla size {size!r}; known: {sorted(SIZE_PRESETS)}")
        return cls.from_dict({**SIZE_PRESETS[size], **kwargs, "size": size})

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples become lists), as written to an export's config.json."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlowVLAConfig:
        d = known_fields(cls, d)
        for key in ("image_size", "vision_channels", "vision_strides"):
            if key in d:
                d[key] = tuple(int(v) for v in d[key])
        if "camera_keys" in d:
            d["camera_keys"] = tuple(d["camera_keys"])
        return cls(**d)

    @classmethod
    def resolve(cls, options: FlowVLAOptions, spec: DataSpec) -> FlowVLAConfig:
        """The size preset with the data's shapes. Cameras are seen at `data.image_size`, else at
        the first camera's resolution (the processor resizes every camera to it). Given
        `vision_strides` replace the preset's (extra convs keep its last width), given
        `vision_channels` its widths, a given `width` its transformer dims."""
        image_size = spec.image_size or spec.camera_shapes[spec.camera_keys[0]][1:]
        return cls.from_size(
            options.size, camera_keys=tuple(spec.camera_keys), image_size=tuple(image_size),
            state_dim=spec.state_dim, action_dim=spec.action_dim, chunk_size=spec.chunk_size,
            max_text_len=options.max_text_len, num_inference_steps=options.num_inference_steps,
            keypoints=options.keypoints,
            **stem_override(options.size, options.vision_strides, options.vision_channels),
            **width_override(options.size, options.width),
        )  # fmt: skip


def width_override(size: str, width: int) -> dict[str, Any]:
    """The transformer dims for a user-given width (0: the preset's): both transformers and the
    FiLM conditioning at `width`, heads of the preset's head size."""
    if not width:
        return {}
    preset = SIZE_PRESETS[size]
    head_dim = preset["d_model"] // preset["num_heads"]
    expert_head_dim = preset["expert_d_model"] // preset["expert_heads"]
    return dict(
        d_model=width, num_heads=width // head_dim, expert_d_model=width,
        expert_heads=width // expert_head_dim, film_dim=width,
    )  # fmt: skip


def stem_override(
    size: str, strides: tuple[int, ...], channels: tuple[int, ...] = ()
) -> dict[str, Any]:
    """The stem dims for user-given strides and widths (none: the preset's own). One conv per
    stride: given widths, else the preset's widths first, then its last width repeated (or cut
    to the first len(strides)). `FlowVLAOptions.check` has matched widths to convs."""
    if not strides and not channels:
        return {}
    strides = tuple(strides) or tuple(SIZE_PRESETS[size]["vision_strides"])
    widths = tuple(channels) or tuple(SIZE_PRESETS[size]["vision_channels"])
    widths = (widths + (widths[-1],) * len(strides))[: len(strides)]
    return {"vision_strides": strides, "vision_channels": widths}
