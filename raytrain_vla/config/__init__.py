"""Typed config: schema, loading and validation."""

from raytrain_vla.config.loader import (
    ConfigError,
    check_batch_layout,
    from_tree,
    load_config,
    parse_cli,
    recipe_hash,
    to_dict,
    to_yaml,
)
from raytrain_vla.config.schema import Config

__all__ = [
    "Config",
    "ConfigError",
    "check_batch_layout",
    "from_tree",
    "load_config",
    "parse_cli",
    "recipe_hash",
    "to_dict",
    "to_yaml",
]
