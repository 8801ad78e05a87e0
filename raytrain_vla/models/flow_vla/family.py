"""The flow_vla family: its typed config, model and processor behind the family contract."""

from __future__ import annotations

from typing import Any

from raytrain_vla.config.schema import FlowVLAOptions
from raytrain_vla.data.normalize import Normalizer
from raytrain_vla.data.spec import DataSpec
from raytrain_vla.models.base import ModelFamily
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.models.flow_vla.processor import FlowVLAProcessor


class FlowVLAFamily(ModelFamily):
    name = "flow_vla"
    config_type = FlowVLAConfig
    model_type = FlowVLA

    def resolve_config(
        self, options: FlowVLAOptions, spec: DataSpec, init_from: str = "", lora=None
    ) -> FlowVLAConfig:
        return FlowVLAConfig.resolve(options, spec)

    def processor(self, config: FlowVLAConfig, normalizer: Normalizer) -> FlowVLAProcessor:
        return FlowVLAProcessor(config, normalizer)

    def config_from_legacy(self, builder_kwargs: dict[str, Any]) -> FlowVLAConfig:
        """Format-1 policies stored `build_flow_vla`'s keyword arguments (size plus shapes)."""
        kwargs = dict(builder_kwargs)
        return FlowVLAConfig.from_size(kwargs.pop("size", "tiny"), **kwargs)


FAMILY = FlowVLAFamily()
