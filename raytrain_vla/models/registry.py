"""Model families by `model.type`: the one place that knows which families exist."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from raytrain_vla.models.base import ModelFamily, PolicyFiles
from raytrain_vla.models.flow_vla.family import FAMILY as FLOW_VLA

FAMILIES: dict[str, ModelFamily] = {}
# Families imported on first use: smolvla needs `transformers` (3 s to import), which runs that
# never use it should not pay for (every Ray worker imports this module).
LAZY_FAMILIES = {"smolvla": "raytrain_vla.models.smolvla.family"}


def register_family(family: ModelFamily) -> ModelFamily:
    """Make `family` reachable by its name; the same family class again replaces it (a module
    imported twice), another class under a taken name is an error."""
    known = FAMILIES.get(family.name)
    if known is not None and type(known).__qualname__ != type(family).__qualname__:
        raise ValueError(f"model type {family.name!r} is already registered by {type(known)}")
    FAMILIES[family.name] = family
    return family


def get_family(model_type: str) -> ModelFamily:
    if model_type not in FAMILIES and model_type in LAZY_FAMILIES:
        register_family(importlib.import_module(LAZY_FAMILIES[model_type]).FAMILY)
    if model_type not in FAMILIES:
        known = ", ".join(sorted({*FAMILIES, *LAZY_FAMILIES})) or "(none)"
        raise ValueError(f"unknown model type {model_type!r}; known types: {known}")
    return FAMILIES[model_type]


def family_options(model_cfg: Any) -> Any:
    """The config tree's `model.<type>` section: the selected family's options."""
    return getattr(model_cfg, model_cfg.type)


def read_foreign_policy(path: Path) -> tuple[ModelFamily, PolicyFiles] | None:
    """The family that reads `path` as another project's policy directory, with what it read."""
    for name in sorted({*FAMILIES, *LAZY_FAMILIES}):
        family = get_family(name)
        if family.foreign_formats:
            files = family.read_foreign(Path(path))
            if files is not None:
                return family, files
    return None


register_family(FLOW_VLA)
