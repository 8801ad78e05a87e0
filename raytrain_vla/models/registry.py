"""Model families by `model.type`: the one place that knows which families exist.

A family is one package under `models/` plus one registration line at the bottom of this file.
The package's `options.py` names its options section (`OPTIONS`, light to import) and its
`family.py` the family (`FAMILY`, imported on first use: smolvla needs `transformers`, 3 s to
import, which runs that never use it should not pay for). Registering a family also registers
its options with the config (`model.<name>`), so YAML, the CLI and `--help` know its keys. This module is the `raytrain_vla.families` entry point the
config loader imports; another package adds families through the same entry-point group.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from raytrain_vla.config.families import FamilyOptions, option_sections, register_options
from raytrain_vla.models.base import ModelFamily, PolicyFiles

FAMILIES: dict[str, ModelFamily] = {}
# Families whose module is imported on first use: name -> module with `FAMILY`.
LAZY_FAMILIES: dict[str, str] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Make `family` reachable by its name and its options a config section; the same family
    class again replaces it (a module imported twice), another class under a taken name is an
    error."""
    known = FAMILIES.get(family.name)
    if known is not None and type(known).__qualname__ != type(family).__qualname__:
        raise ValueError(f"model type {family.name!r} is already registered by {type(known)}")
    register_options(family.name, family.options_type)
    FAMILIES[family.name] = family
    return family


def register_package(name: str, package: str) -> None:
    """The family in `package`: its `options.OPTIONS` now, its `family.FAMILY` on first use."""
    options_type: type[FamilyOptions] = importlib.import_module(f"{package}.options").OPTIONS
    register_options(name, options_type)
    LAZY_FAMILIES[name] = f"{package}.family"


def get_family(model_type: str) -> ModelFamily:
    if model_type not in FAMILIES and model_type in LAZY_FAMILIES:
        family = importlib.import_module(LAZY_FAMILIES[model_type]).FAMILY
        if family.name != model_type or family.options_type is not option_sections()[model_type]:
            raise ValueError(
                f"{LAZY_FAMILIES[model_type]}.FAMILY is {family.name!r} with options "
                f"{family.options_type.__qualname__}; registered as {model_type!r}"
            )
        register_family(family)
    if model_type not in FAMILIES:
        raise ValueError(f"unknown model type {model_type!r}; known types: {family_names()}")
    return FAMILIES[model_type]


def family_names() -> list[str]:
    """Every registered family, eager or lazy, sorted."""
    return sorted({*FAMILIES, *LAZY_FAMILIES})


def read_foreign_policy(
    path: Path, options: dict[str, Any] | None = None
) -> tuple[ModelFamily, PolicyFiles] | None:
    """The family that reads `path` as another project's policy directory, with what it read;
    `options` are passed to the family that reads it (and refused if none does)."""
    for name in family_names():
        family = get_family(name)
        if family.foreign_formats:
            files = family.read_foreign(Path(path), options or None)
            if files is not None:
                return family, files
    return None


# The registered families, one line each (the first is `model.type`'s default in code).
register_package("flow_vla", "raytrain_vla.models.flow_vla")
register_package("smolvla", "raytrain_vla.models.smolvla")
register_package("toy_mlp", "raytrain_vla.models.toy_mlp")
register_package("pi0", "raytrain_vla.models.pi0")
register_package("pi05", "raytrain_vla.models.pi05")
register_package("wall_x", "raytrain_vla.models.wall_x")
