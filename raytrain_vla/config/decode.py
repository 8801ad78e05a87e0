"""A plain tree into the typed config, with draccus, and back.

The `model` section is open: draccus decodes each registered family's options section
(`model.<family>`) into that family's dataclass, and encodes them back under the same keys.
Errors name the dotted key and, for a choice, the values it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from typing import Any

import draccus
from draccus.parsers.decoding import decode_dataclass, get_decoding_fn

from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.families import option_sections
from raytrain_vla.config.keys import check_keys, field_types
from raytrain_vla.config.schema import Config, ModelConfig


def _decode_model(raw: Any, path: Sequence[str] = ()) -> ModelConfig:
    if not isinstance(raw, dict):
        raise draccus.utils.DecodingError(tuple(path), f"expected a mapping, got {raw!r}")
    shared = dict(raw)
    sections = {}
    for name, options_type in option_sections().items():
        value = shared.pop(name, {})
        sections[name] = get_decoding_fn(options_type)(value, (*path, name))
    model = decode_dataclass(ModelConfig, shared, tuple(path))
    model.sections = sections
    return model


def _encode_model(model: ModelConfig, declared_type: Any = None) -> dict[str, Any]:
    types = field_types(ModelConfig)
    shared = {
        f.name: draccus.encode(getattr(model, f.name), types.get(f.name))
        for f in dataclasses.fields(model)
        if f.name != ModelConfig.OPEN_SECTIONS
    }
    first = next(iter(shared))
    sections = {name: draccus.encode(value) for name, value in model.sections.items()}
    return {first: shared.pop(first), **sections, **shared}


draccus.decode.register(ModelConfig, _decode_model)
draccus.encode.register(ModelConfig, _encode_model)


def decode(tree: dict, source: str) -> Config:
    """The typed tree of `tree`; one-line errors name the key (unknown keys: the nearest)."""
    check_keys(tree, source)
    try:
        return draccus.decode(Config, tree)
    except draccus.utils.DecodingError as err:
        key = ".".join(str(p) for p in err.key_path) or "<root>"
        detail = _choices_detail(tree, err.key_path) or " ".join(str(err.message).split())
        raise ConfigError(f"{source}: bad value for '{key}': {detail}") from err
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {' '.join(str(err).split())}") from err


def to_dict(cfg: Config) -> dict:
    """Plain JSON/YAML-safe tree (tuples become lists)."""
    return json.loads(json.dumps(draccus.encode(cfg)))


def _choices_detail(tree: dict, key_path: tuple) -> str:
    """`'huge', expected one of ('tiny', 'small', 'base')` when the key is a Literal field."""
    cls: Any = Config
    value: Any = tree
    for part in key_path:
        if dataclasses.is_dataclass(cls):
            cls = field_types(cls).get(str(part))
        elif typing.get_origin(cls) is dict:  # e.g. normalization_per_feature.<feature>
            cls = typing.get_args(cls)[1]
        else:
            return ""
        value = value.get(part) if isinstance(value, dict) else None
    literals = [a for a in typing.get_args(cls) if typing.get_origin(a) is typing.Literal]
    if literals:  # an optional choice: `Literal[...] | None`
        cls = literals[0]
    if typing.get_origin(cls) is typing.Literal:
        return f"{value!r}, expected one of {typing.get_args(cls)}"
    return ""
