"""The schema's keys: each section's fields (family sections included), the nearest valid key for
a typo, and dotted get/set on plain config trees. One implementation for the loader, the help
and the Tune space."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Iterable
from typing import Any

from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.families import option_sections
from raytrain_vla.config.schema import Config

REMOVED_KEYS = {"data.preload": "it never had an effect; remove it"}
# `optimizer.groups.NAME.FIELD` addresses an LR group by its name.
GROUP_PREFIX = "optimizer.groups."


def field_types(cls: type) -> dict[str, Any]:
    """A section's keys and their resolved types (ClassVars left out). A section that declares
    `OPEN_SECTIONS` (the `model` section) lists each registered family's options in place of
    that field."""
    hints = _hints(cls)
    open_field = getattr(cls, "OPEN_SECTIONS", None)
    if open_field is None:
        return hints
    out = {name: tp for name, tp in hints.items() if name != open_field}
    first = next(iter(out))
    families = option_sections()
    return {first: out.pop(first), **families, **out}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Once per class: a sweep's space check decodes hundreds of configs."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def valid_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key the schema accepts (sections and leaves)."""
    keys: list[str] = []
    for name, tp in field_types(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if dataclasses.is_dataclass(tp):
            keys.extend(valid_keys(tp, key + "."))
    return keys


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to a misspelt `name` (None when there are none)."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.0)
    return match[0] if match else None


def moved_keys() -> dict[str, str]:
    """Keys of earlier versions -> where they live now, as the families declare them."""
    out: dict[str, str] = {}
    for options_type in option_sections().values():
        out.update(options_type.MOVED_KEYS)
    return out


def nearest_key(key: str) -> str:
    """` (did you mean 'x'?)`, or where a moved key went, or why a removed key is gone."""
    moved = moved_keys()
    if key in moved:
        return f" (it moved to '{moved[key]}')"
    if key in REMOVED_KEYS:
        return f" ({REMOVED_KEYS[key]})"
    match = closest(key, valid_keys())
    return f" (did you mean '{match}'?)" if match else ""


def check_keys(tree: dict, source: str, cls: type = Config, prefix: str = "") -> None:
    """Reject unknown keys before decoding, so the message can point at the nearest valid key."""
    types = field_types(cls)
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if name not in types:
            raise ConfigError(f"{source}: unknown key '{key}'{nearest_key(key)}")
        if dataclasses.is_dataclass(types[name]):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{key}' must be a mapping of its fields")
            check_keys(value, source, types[name], key + ".")


def get_dotted(node: Any, key: str) -> Any:
    """`a.b.c` of a plain tree (dicts) or of the typed config; `optimizer.groups.NAME.FIELD`
    reads a group by name. KeyError, AttributeError or StopIteration when it is absent."""
    if key.startswith(GROUP_PREFIX):
        name, field_name = key[len(GROUP_PREFIX) :].split(".")
        groups = get_dotted(node, "optimizer.groups")
        group = next(g for g in groups if _item(g, "name") == name)
        return _item(group, field_name)
    for part in key.split("."):
        node = _item(node, part)
    return node


def _item(node: Any, name: str) -> Any:
    return node[name] if isinstance(node, dict) else getattr(node, name)


def set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    """Set `a.b.c` in a plain tree (an unknown key is an error naming the nearest one);
    `optimizer.groups.NAME.FIELD` sets a group's lr or weight_decay. A whole float given for
    an int field (Tune's quniform) becomes an int."""
    if key.startswith(GROUP_PREFIX):
        parts = key[len(GROUP_PREFIX) :].split(".")
        groups = tree["optimizer"]["groups"]
        names = [g["name"] for g in groups]
        if len(parts) != 2 or parts[0] not in names:
            raise ConfigError(
                f"{source}: unknown key '{key}': LR groups are addressed as "
                f"'optimizer.groups.NAME.FIELD' with NAME one of {names}"
            )
        group = groups[names.index(parts[0])]
        if parts[1] not in group or parts[1] in ("name", "patterns"):
            raise ConfigError(f"{source}: '{key}': a group's tunable fields are lr, weight_decay")
        group[parts[1]] = _like(group[parts[1]], value)
        return
    if key not in valid_keys():
        raise ConfigError(f"{source}: unknown config key '{key}'{nearest_key(key)}")
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = _like(node.get(parts[-1]), value)


def _like(current: Any, value: Any) -> Any:
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return value
