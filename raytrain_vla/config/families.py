"""The model families' option sections: `model.type` picks a family, `model.<type>.*` its options.

config/ names no family. A family registers its frozen options dataclass here (through
`models/registry.register_family`), and the registered sections join the schema: YAML, the CLI
and `--help` see them like any other section. Families are found through the
`raytrain_vla.families` entry-point group, whose modules register their families when imported
(this package's own `models/registry.py`, or another package's), so loading a config needs no
import of `models/`.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

ENTRY_POINT_GROUP = "raytrain_vla.families"

_SECTIONS: dict[str, type[FamilyOptions]] = {}
_discovered = False


class FamilyOptions:
    """Base of every family's options section (a frozen dataclass): what the config room may
    ask of a family without importing it."""

    # Actions per sample when `data.chunk_size` is not given (LeRobot's default for its models).
    DEFAULT_CHUNK_SIZE: ClassVar[int] = 50
    # Option names holding local paths: made absolute against the working directory on the
    # driver, since Ray workers run elsewhere.
    PATH_OPTIONS: ClassVar[tuple[str, ...]] = ()
    # Keys of earlier versions -> where they live now, e.g. {"model.size": "model.x.size"}.
    MOVED_KEYS: ClassVar[dict[str, str]] = {}

    def default_chunk_size(self, init_from: str) -> tuple[int, str]:
        """(`data.chunk_size` when the config leaves it out, where that value comes from); a
        family that reads other projects' checkpoints may take the one `init_from` names."""
        return self.DEFAULT_CHUNK_SIZE, "the model family's default"

    def check(self, key: str) -> None:
        """Refuse values no model can use (ValueError naming `key`.<option>); never mutates."""
        return None

    def with_absolute_paths(self) -> FamilyOptions:
        """A copy whose PATH_OPTIONS are absolute (empty stays empty)."""
        paths = {
            name: str(Path(getattr(self, name)).expanduser().resolve())
            for name in self.PATH_OPTIONS
            if getattr(self, name)
        }
        return dataclasses.replace(self, **paths) if paths else self


def register_options(name: str, options_type: type[FamilyOptions]) -> None:
    """Make `model.<name>` a section of the schema; the same class again is a no-op."""
    if not (dataclasses.is_dataclass(options_type) and issubclass(options_type, FamilyOptions)):
        raise TypeError(f"{options_type!r}: family options must be a FamilyOptions dataclass")
    known = _SECTIONS.get(name)
    if known is not None and known.__qualname__ != options_type.__qualname__:
        raise ValueError(f"model type {name!r} already has options {known.__qualname__}")
    _SECTIONS[name] = options_type


def discover() -> None:
    """Import the modules of the `raytrain_vla.families` entry points once; importing them
    registers their families."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()


def option_sections() -> dict[str, type[FamilyOptions]]:
    """Family name -> its options type, in registration order."""
    discover()
    return dict(_SECTIONS)


def default_family() -> str:
    """The first family registered: the type of a `ModelConfig()` made in code."""
    sections = option_sections()
    if not sections:
        raise RuntimeError(
            f"no model family is registered: is raytrain_vla installed (entry points "
            f"{ENTRY_POINT_GROUP!r})?"
        )
    return next(iter(sections))


def default_sections() -> dict[str, Any]:
    """Every registered family's options at their defaults."""
    return {name: options_type() for name, options_type in option_sections().items()}
