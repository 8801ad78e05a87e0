"""Typed config: schema, loading and validation."""

from raytrain_vla.config.loader import (
    ConfigError,
    absolute_paths,
    check_batch_layout,
    dataset_configs,
    from_tree,
    load_config,
    parse_cli,
    recipe_hash,
    to_dict,
    to_yaml,
)
from raytrain_vla.config.schema import Config

__all__ = [
    "absolute_paths",
    "Config",
    "ConfigError",
    "check_batch_layout",
    "dataset_configs",
    "from_tree",
    "load_config",
    "parse_cli",
    "recipe_hash",
    "to_dict",
    "to_yaml",
]
