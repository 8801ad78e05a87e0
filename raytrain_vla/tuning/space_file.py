"""What a sweep space file may say: its sections as dataclasses, decoded with draccus like the run
config, and the rules on their values that a type cannot express.

Only the file itself is checked here; whether its keys and values fit the config schema is
`space.py`'s job. The format is documented in `tune_spaces/README.md`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import draccus

from raytrain_vla.config import ConfigError
from raytrain_vla.config.keys import closest, field_types
from raytrain_vla.config.parse import read_yaml_mapping

Metric = Literal["val_action_mse", "val_action_l1", "val_loss", "val_mse_ratio"]
SchedulerType = Literal["asha", "median", "none"]
Algorithm = Literal["random", "optuna"]
# A section's rules on its values: field -> (test, what is expected); the field "" tests the
# section as a whole. A field left empty (None) is not tested.
Rules = dict[str, tuple[Callable[[Any], bool], str]]


class SpaceError(ConfigError):
    """A space file that cannot be swept; the message names the file and key."""


class Integer(int):
    """An int as YAML writes it (draccus's `int` also takes '3' and true)."""


class Real(float):
    """An int or finite float as YAML writes it (draccus's `float` also takes '2' and nan)."""


def _decode_strict(cls: type, raw: Any, path: Sequence[str]) -> Any:
    """The value as written, if it is of `cls`'s kind."""
    is_int = isinstance(raw, int) and not isinstance(raw, bool)
    if is_int or (cls is Real and isinstance(raw, float) and math.isfinite(raw)):
        return raw
    expected = "an integer" if cls is Integer else "a finite number"
    raise draccus.utils.DecodingError(tuple(path), f"{raw!r}, expected {expected}")


# Subclasses included: their decoder then also sees None, which is not a number either.
draccus.decode.register(Integer, _decode_strict, include_subclasses=True)
draccus.decode.register(Real, _decode_strict, include_subclasses=True)


# DomainSpec's fields but `when`.
DOMAINS = ("loguniform", "uniform", "quniform", "randint", "choice", "grid")


def _positive(value: int) -> bool:
    return value > 0


def _non_empty(value: Sequence) -> bool:
    return len(value) > 0


def _range(args: list, count: int) -> bool:
    return len(args) == count and args[0] < args[1]


@dataclass(repr=False)
class DomainSpec:
    """One searched key: exactly one domain, and optionally when it applies."""

    loguniform: list[Real] | None = None
    uniform: list[Real] | None = None
    quniform: list[Real] | None = None  # [lo, hi, q]
    randint: list[Integer] | None = None  # [lo, hi)
    choice: list[Any] | None = None
    grid: list[Any] | None = None  # every value, times num_samples
    # Active only when each named config key has the value, or one of the list of values.
    when: dict[str, Any] = field(default_factory=dict)

    RULES: ClassVar[Rules] = {
        "": (lambda spec: len(spec.given()) == 1, f"one of {DOMAINS} (plus an optional 'when')"),
        "loguniform": (lambda a: _range(a, 2) and a[0] > 0, "[lo, hi] with 0 < lo < hi"),
        "uniform": (lambda a: _range(a, 2), "[lo, hi] with lo < hi"),
        "quniform": (lambda a: _range(a, 3) and a[2] > 0, "[lo, hi, q] with lo < hi, q > 0"),
        "randint": (lambda a: _range(a, 2), "[lo, hi) with lo < hi"),
        "choice": (_non_empty, "a non-empty list of values"),
        "grid": (_non_empty, "a non-empty list of values"),
    }

    def given(self) -> dict[str, list]:
        """The domains the file gives (one, once the rules hold)."""
        return {name: getattr(self, name) for name in DOMAINS if getattr(self, name) is not None}

    def __repr__(self) -> str:
        return repr({**self.given(), **({"when": self.when} if self.when else {})})


@dataclass
class SchedulerSpec:
    type: SchedulerType = "asha"
    # Steps a trial always runs before it can be stopped; 0 means one validation interval.
    grace_period: Integer = 0
    reduction_factor: Real = 2.0  # asha
    # Median stopping: trials that must report before the median is trusted.
    min_samples_required: Integer = 3

    RULES: ClassVar[Rules] = {
        "grace_period": (lambda steps: steps >= 0, "an integer number of steps >= 0"),
        "reduction_factor": (lambda factor: factor > 1, "a number > 1"),
        "min_samples_required": (_positive, "a positive integer"),
    }


@dataclass
class SearchSpec:
    algorithm: Algorithm = "random"
    seed: Integer | None = None


@dataclass
class Resources:
    """Each trial's `ray.*` keys, typed as there; a key left out keeps the base config's."""

    num_workers: Integer | tuple[Integer, Integer] | None = None
    resources_per_worker: dict[str, Real] | None = None
    use_gpu: bool | None = None


@dataclass
class SpaceFile:
    """A space file's top level, as written."""

    metric: Metric = "val_action_mse"
    mode: Literal["min", "max"] = "min"
    num_samples: Integer = 1  # samples per grid point
    max_concurrent_trials: Integer = 1
    resources: Resources = field(default_factory=Resources)
    fixed: dict[str, Any] = field(default_factory=dict)  # dotted config key -> value
    scheduler: SchedulerSpec = field(default_factory=lambda: SchedulerSpec(type="none"))
    search: SearchSpec = field(default_factory=SearchSpec)
    params: dict[str, DomainSpec] = field(default_factory=dict)  # dotted config key -> domain

    RULES: ClassVar[Rules] = {
        "num_samples": (_positive, "a positive integer"),
        "max_concurrent_trials": (_positive, "a positive integer"),
        "params": (_non_empty, "a non-empty mapping of dotted config keys to domains"),
    }


def read_space_file(path: Path) -> SpaceFile:
    """The decoded file; SpaceError naming the file and key (for an unknown key, the nearest)."""
    source = str(path)
    raw = read_yaml_mapping(path, "space file", "a mapping", SpaceError)
    raw = {k: v for k, v in raw.items() if v is not None}  # `fixed:` alone keeps the default
    _check_names(raw, SpaceFile, source, "")
    try:
        spec = draccus.decode(SpaceFile, raw)
    except draccus.utils.DecodingError as err:
        inner = err  # a union (`int | None`) wraps its first alternative's error: say that one
        while isinstance(inner.__cause__, draccus.utils.DecodingError):
            inner = inner.__cause__
        key = ".".join(str(p) for p in inner.key_path)
        detail = " ".join(str(inner.message).split())
        raise SpaceError(f"{source}: bad value for '{key}': {detail}") from err
    _check_rules(spec, source, "")
    grid = [key for key, domain in spec.params.items() if domain.grid is not None]
    if grid and spec.search.algorithm != "random":
        raise SpaceError(
            f"{source}: 'params.{grid[0]}': grid domains need search.algorithm: random"
        )
    return spec


def _dotted(key: str, name: Any) -> str:
    return f"{key}.{name}" if key else str(name)


def _check_names(raw: Any, cls: Any, source: str, key: str) -> None:
    """What draccus would say less clearly: a section that is not a mapping, an unknown key (with
    the nearest one of its section) and a value that is not one of a Literal's choices."""
    args = typing.get_args(cls)
    if typing.get_origin(cls) is Literal:
        if raw not in args:
            raise SpaceError(f"{source}: bad value for '{key}': {raw!r}, expected one of {args}")
        return
    section = dataclasses.is_dataclass(cls)
    if not section and typing.get_origin(cls) is not dict:
        return
    if not isinstance(raw, dict):
        raise SpaceError(f"{source}: bad value for '{key}': {raw!r}, expected a mapping")
    types = field_types(cls) if section else dict.fromkeys(raw, args[1])
    for name, value in raw.items():
        if name not in types:
            near = closest(str(name), types)
            raise SpaceError(
                f"{source}: unknown key '{_dotted(key, name)}' "
                f"(did you mean '{_dotted(key, near)}'?)"
            )
        _check_names(value, types[name], source, _dotted(key, name))


def _check_rules(node: Any, source: str, key: str) -> None:
    """The RULES of every section at and below `node` (mappings of sections included)."""
    if isinstance(node, dict):
        for name, value in node.items():
            _check_rules(value, source, _dotted(key, name))
    if not dataclasses.is_dataclass(node):
        return
    for name, (test, expected) in getattr(node, "RULES", {}).items():
        value = getattr(node, name) if name else node
        if value is not None and not test(value):
            where = _dotted(key, name) if name else key
            raise SpaceError(f"{source}: bad value for '{where}': {value!r}, expected {expected}")
    for f in dataclasses.fields(node):
        _check_rules(getattr(node, f.name), source, _dotted(key, f.name))
