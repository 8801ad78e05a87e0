"""Model registry: ``model.type`` -> builder, so new families plug in without touching the loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

ModelBuilder = Callable[..., nn.Module]
MODEL_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(type_name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator: register ``builder(**kwargs) -> nn.Module`` under ``type_name``."""

    def wrap(builder: ModelBuilder) -> ModelBuilder:
        if type_name in MODEL_REGISTRY and MODEL_REGISTRY[type_name] is not builder:
            raise ValueError(f"model type {type_name!r} is already registered")
        MODEL_REGISTRY[type_name] = builder
        return builder

    return wrap


def _ensure_builtin_models() -> None:
    # Importing registers the built-in families; done lazily to avoid an import cycle.
    from raytrain_vla.models import flow_vla  # noqa: F401


def build_model(model_type: str, cfg: Mapping[str, Any] | Any) -> nn.Module:
    """Build a registered model from keyword arguments (a mapping or a dataclass instance)."""
    _ensure_builtin_models()
    if model_type not in MODEL_REGISTRY:
        known = ", ".join(sorted(MODEL_REGISTRY)) or "(none)"
        raise ValueError(f"unknown model type {model_type!r}; known types: {known}")
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        kwargs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    else:
        kwargs = dict(cfg)
    return MODEL_REGISTRY[model_type](**kwargs)
