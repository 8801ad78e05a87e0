"""Typed config: schema, loading and validation."""

from raytrain_vla.config.decode import to_dict
from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.loader import (
    absolute_paths,
    dataset_configs,
    from_tree,
    load_config,
    parse_cli,
)
from raytrain_vla.config.recipe import recipe_hash, to_yaml
from raytrain_vla.config.schema import Config
from raytrain_vla.config.validate import check_batch_layout

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
