"""Models: the registry, the built-in flow_vla policy and its byte-level tokenizer."""

from raytrain_vla.models.flow_vla import (
    SIZE_PRESETS,
    FlowVLA,
    FlowVLAConfig,
    build_flow_vla,
    count_parameters,
    flow_noise_and_time,
)
from raytrain_vla.models.registry import MODEL_REGISTRY, build_model, register_model
from raytrain_vla.models.tokenizer import VOCAB_SIZE, tokenize

__all__ = [
    "MODEL_REGISTRY",
    "SIZE_PRESETS",
    "VOCAB_SIZE",
    "FlowVLA",
    "FlowVLAConfig",
    "build_flow_vla",
    "build_model",
    "count_parameters",
    "flow_noise_and_time",
    "register_model",
    "tokenize",
]
