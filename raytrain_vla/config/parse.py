"""Reading what the user wrote: YAML files, `--config PATH` and `--dotted.key=value` overrides,
merged over the packaged default. Plain trees in, plain trees out; decoding comes after."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.keys import field_types
from raytrain_vla.config.schema import Config

DEFAULT_CONFIG = "default.yaml"


def packaged_default() -> dict:
    text = resources.files("raytrain_vla.config").joinpath(DEFAULT_CONFIG).read_text()
    return yaml.safe_load(text) or {}


def read_yaml_mapping(
    path: str | Path, kind: str, expected: str, error: type[ConfigError] = ConfigError
) -> dict:
    """A YAML file whose top level is a mapping; `error` names the file and what went wrong."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {kind} not found")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(tree, dict):
        raise error(f"{path}: expected {expected} at the top level")
    return tree


def read_config_file(path: str | Path) -> dict:
    return read_yaml_mapping(path, "config file", "a mapping of config sections")


def merge(base: dict, update: dict, cls: type = Config) -> dict:
    """`update` over `base`: sections merge key by key, every other value (a mapping such as
    `ray.resources_per_worker` included) is replaced whole, as the user wrote it."""
    out = dict(base)
    types = field_types(cls)
    for key, value in update.items():
        section = types.get(key)
        if (
            isinstance(value, dict)
            and isinstance(out.get(key), dict)
            and dataclasses.is_dataclass(section)
        ):
            out[key] = merge(out[key], value, section)
        else:
            out[key] = value
    return out


def parse_overrides(args: list[str]) -> dict:
    """Turn `--a.b=c` (or `--a.b c`) into a nested dict; values are parsed as YAML scalars."""
    tree: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"unexpected argument '{arg}': overrides look like --section.key=value"
            )
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, raw = arg[2:], args[i + 1]
            i += 1
        else:
            raise ConfigError(f"override '{arg}' has no value: use --{arg[2:]}=VALUE")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '--{key}' conflicts with another override")
        node[parts[-1]] = value
        i += 1
    return tree


def split_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """(`--config PATH` or None, the dotted overrides)."""
    config_path = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a path")
            config_path = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return config_path, rest


def command_line_keys(argv: list[str]) -> dict[str, Any]:
    """The dotted keys (leaves, or whole mappings) the overrides in `argv` set, with values."""
    out: dict[str, Any] = {}

    def walk(tree: dict, prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[prefix + key] = value

    walk(parse_overrides(split_cli(argv)[1]), "")
    return out
