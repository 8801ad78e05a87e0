"""Load the config tree from packaged defaults, a YAML file and `--dotted.key=value` overrides.

The steps, each in its own module: parse and merge (`parse.py`), decode with draccus
(`decode.py`), fill the defaults that depend on other keys (here), validate (`validate.py`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import raytrain_vla.config.data_root as locate
from raytrain_vla.common.uri import is_uri
from raytrain_vla.config.decode import decode
from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.families import option_sections
from raytrain_vla.config.keys import check_keys
from raytrain_vla.config.parse import (
    merge,
    packaged_default,
    parse_overrides,
    read_config_file,
    split_cli,
)
from raytrain_vla.config.schema import Config, DataConfig
from raytrain_vla.config.validate import mixture_entry_name, validate


def from_tree(tree: dict, source: str = "config") -> Config:
    """Decode a plain nested dict into the typed tree, with one-line errors naming the key."""
    cfg = decode(tree, source)
    _check_model_type(cfg, source)
    _fill_defaults(cfg, tree)
    validate(cfg)
    return cfg


def _check_model_type(cfg: Config, source: str) -> None:
    known = tuple(option_sections())
    if cfg.model.type not in known:
        raise ConfigError(
            f"{source}: bad value for 'model.type': {cfg.model.type!r}, expected one of {known}"
        )


def _fill_defaults(cfg: Config, tree: dict) -> None:
    """Values that default to other keys': the action chunk (the family's, or the checkpoint's
    it starts from) and each mixture entry's name."""
    if "chunk_size" not in (tree.get("data") or {}):
        chunk, _source = cfg.model.options.default_chunk_size(cfg.model.init_from)
        cfg.data.chunk_size = chunk
    for entry in cfg.data.mixture:
        entry.name = entry.name or mixture_entry_name(entry.root, entry.repo_id)


def load_config(
    config_path: str | Path | None = None, overrides: list[str] | None = None
) -> Config:
    """Packaged defaults, then the YAML file, then CLI overrides, decoded and validated."""
    tree = packaged_default()
    source = "default config"
    if config_path:
        file_tree = read_config_file(config_path)
        check_keys(file_tree, str(config_path))
        tree = merge(tree, file_tree)
        source = str(config_path)
    if overrides:
        override_tree = parse_overrides(overrides)
        check_keys(override_tree, "command line")
        tree = merge(tree, override_tree)
        source = "command line" if not config_path else f"{config_path} + command line"
    return from_tree(tree, source)


def parse_cli(argv: list[str]) -> Config:
    """`--config PATH` plus dotted overrides."""
    return load_config(*split_cli(argv))


def dataset_configs(data: DataConfig) -> list[DataConfig]:
    """One data config per dataset: `data` itself, or one per mixture entry (its root, every
    other key shared)."""
    if not data.mixture:
        return [data]
    return [
        dataclasses.replace(data, root=e.root or locate.DEMO, repo_id=e.repo_id, mixture=[])
        for e in data.mixture
    ]


def resolve_data_root(data: DataConfig) -> Path | str:
    """`demo`, a `repo_id` in the local LeRobot cache, an object-store URI as typed, or the
    path as typed (made absolute)."""
    if data.repo_id:
        if data.root not in (locate.DEMO, str(locate.demo_root(*locate.DEMO_DEFAULTS))):
            raise ConfigError(
                f"'data.repo_id' {data.repo_id!r} and 'data.root' {data.root!r} both name the "
                "dataset; give one of them"
            )
        if data.repo_id.count("/") != 1 or any(
            p in ("", ".", "..") for p in data.repo_id.split("/")
        ):
            raise ConfigError(
                f"bad value for 'data.repo_id': {data.repo_id!r}, expected OWNER/NAME as on the Hub"
            )
        return locate.repo_root(data.repo_id)
    if data.root == locate.DEMO:
        return locate.demo_root(data.demo_episodes, data.demo_seed)
    if is_uri(data.root):
        return data.root.rstrip("/")
    return Path(data.root).expanduser().resolve()


def absolute_paths(cfg: Config) -> Config:
    """Resolve local paths where the user typed them: Ray workers run in their own directories.
    A family's path options (its `PATH_OPTIONS`) are resolved too."""
    storage = cfg.ray.storage_path
    if is_uri(storage):  # object storage (s3://, gs://, ...): kept as typed
        cfg.ray.storage_path = storage.rstrip("/")
    else:
        cfg.ray.storage_path = str(Path(storage.removeprefix("file://")).expanduser().resolve())
    if cfg.data.mixture:
        for entry, one in zip(cfg.data.mixture, dataset_configs(cfg.data), strict=True):
            entry.root, entry.repo_id = str(resolve_data_root(one)), ""
    else:
        cfg.data.root = str(resolve_data_root(cfg.data))
    if cfg.model.init_from:
        cfg.model.init_from = str(Path(cfg.model.init_from).expanduser().resolve())
    cfg.model.sections = {
        name: options.with_absolute_paths() for name, options in cfg.model.sections.items()
    }
    return cfg
