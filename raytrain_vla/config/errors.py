"""The config's one error type."""

from __future__ import annotations

from raytrain_vla.errors import NotRetriable


class ConfigError(NotRetriable, ValueError):
    """A config file or override that does not fit the schema; the message names the key."""
