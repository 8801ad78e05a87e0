"""The flow_vla family: its typed config, model and processor behind the family contract."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.base import InputBudget, ModelFamily
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.layers import conv_out_size
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.models.flow_vla.options import FlowVLAOptions
from raytrain_vla.models.flow_vla.processor import FlowVLAProcessor


class FlowVLAFamily(ModelFamily):
    name = "flow_vla"
    options_type = FlowVLAOptions
    config_type = FlowVLAConfig
    model_type = FlowVLA

    def resolve_config(
        self, options: FlowVLAOptions, spec: DataSpec, init_from: str = "", lora=None
    ) -> FlowVLAConfig:
        return FlowVLAConfig.resolve(options, spec)

    def processor(self, config: FlowVLAConfig, normalizer: Normalizer) -> FlowVLAProcessor:
        return FlowVLAProcessor(config, normalizer)

    def input_budget(self, config: FlowVLAConfig) -> InputBudget:
        """Every camera is resized to `config.image_size`; each stride-2 conv halves it, and the
        last feature map's cells are the tokens, then `keypoints` more. Text is UTF-8 bytes."""
        height, width = config.image_size
        for stride in config.vision_strides:
            height, width = conv_out_size(height, stride), conv_out_size(width, stride)
        return InputBudget(
            image_size=tuple(config.image_size),
            tokens_per_camera=height * width + config.keypoints,
            pixels_per_token=math.prod(config.vision_strides),
            text_budget=config.max_text_len,
            text_budget_key=f"model.{self.name}.max_text_len",
            text_unit="bytes",
            count_text=lambda text: len(text.encode("utf-8")),
        )

    def tiny_options(self, fixtures: Path | None) -> FlowVLAOptions:
        return FlowVLAOptions(size="tiny")

    def config_from_legacy(self, builder_kwargs: dict[str, Any]) -> FlowVLAConfig:
        """Format-1 policies stored `build_flow_vla`'s keyword arguments (size plus shapes)."""
        kwargs = dict(builder_kwargs)
        return FlowVLAConfig.from_size(kwargs.pop("size", "tiny"), **kwargs)


FAMILY = FlowVLAFamily()
