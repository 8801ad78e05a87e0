"""Whether a location is an object-store URI: one test for the config, data and run storage."""

from __future__ import annotations

import os


def is_uri(value: str | os.PathLike) -> bool:
    """`s3://...` and other object-store URIs (`file://` is a path)."""
    return "://" in str(value) and not str(value).startswith("file://")
