"""Sweep spaces: a decoded space file checked against the config schema, and its sampled
values applied to the base config.

Pure Python (no Ray): a bad space file is refused, with the file and key named, before any
trial starts. The file's own format and rules are `space_file.py`'s; the format is documented
in `tune_spaces/README.md`.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import draccus

from raytrain_vla.config import Config, ConfigError, from_tree, keys, to_dict
from raytrain_vla.config.keys import GROUP_PREFIX, get_dotted, nearest_key
from raytrain_vla.config.recipe import RESUMABLE_KEYS

# SchedulerSpec and SpaceError are this module's too (the sweep and the CLI import them here).
from raytrain_vla.tuning.space_file import DomainSpec, SchedulerSpec, SpaceError, read_space_file

# Recipe keys that define what the metric measures: tuning them would compare different things.
NOT_TUNABLE = ("data.val_fraction", "data.val_episodes", "data.demo_episodes", "data.demo_seed")
# How many sampled values and combinations a space is checked with before any trial starts.
MAX_VALUES_PER_PARAM = 64
MAX_COMBINATIONS = 256
PAIR_VALUES = 4


@dataclass(frozen=True)
class Param:
    key: str
    domain: str
    args: tuple
    # Active only when every named key has one of the listed values (others keep the default).
    when: dict[str, tuple] = field(default_factory=dict)


@dataclass
class Space:
    path: Path
    metric: str
    mode: str
    num_samples: int
    max_concurrent_trials: int
    params: list[Param]
    scheduler: SchedulerSpec
    algorithm: str = "random"
    seed: int | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    # `fixed`/`resources` entries the command line replaced, as lines to show the user.
    replaced_by_command_line: tuple[str, ...] = ()

    def has_grid(self) -> bool:
        return any(p.domain == "grid" for p in self.params)


def set_dotted(tree: dict, key: str, value: Any, source: str) -> None:
    """`config.keys.set_dotted`, its errors as SpaceError (the space file is what is wrong)."""
    try:
        keys.set_dotted(tree, key, value, source)
    except SpaceError:
        raise
    except ConfigError as err:
        raise SpaceError(str(err)) from err


def _has_key(tree: dict, key: str) -> bool:
    try:
        get_dotted(tree, key)
    except (KeyError, AttributeError, StopIteration, ValueError, TypeError):
        return False
    return True


def is_tunable(key: str) -> bool:
    """Recipe keys only: budget, resources, logging and storage are the sweep's, not a trial's."""
    if key.startswith(GROUP_PREFIX):
        return True
    blocked = RESUMABLE_KEYS + NOT_TUNABLE
    return not any(key == k or key.startswith(k + ".") for k in blocked)


def _param(key: str, spec: DomainSpec) -> Param:
    ((domain, args),) = spec.given().items()
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in spec.when.items()}
    return Param(key, domain, tuple(args), when)


def _thin(values: list, limit: int) -> list:
    """At most `limit` values, evenly spread and keeping both ends."""
    if len(values) <= limit:
        return values
    step = (len(values) - 1) / (limit - 1)
    return [values[round(i * step)] for i in range(limit)]


def _candidates(param: Param, limit: int = MAX_VALUES_PER_PARAM) -> list[Any]:
    """Values the domain can produce, to check against the schema before any trial starts.

    Integer domains are enumerated (thinned to `limit`), since rules such as batch divisibility
    hold for some integers of a range and not others. The schema's rules on real numbers are
    intervals (>= 0, in [0, 1]), so a real range is checked at its ends and middle.
    """
    if param.domain in ("choice", "grid"):
        return _thin(list(param.args), limit)
    lo, hi = param.args[0], param.args[1]
    if param.domain == "randint":
        return _thin(list(range(lo, hi)), limit)
    if param.domain == "quniform":
        q = param.args[2]
        first, last = math.ceil(lo / q), math.floor(hi / q)
        return _thin([float(k * q) for k in range(first, last + 1)], limit)
    middle = math.sqrt(lo * hi) if param.domain == "loguniform" else (lo + hi) / 2
    return [float(lo), float(middle), float(hi)]


def _combinations(space: Space) -> Iterator[dict[str, Any]]:
    """Sampled-value combinations to check: every one when there are few, else each value alone
    and every pair of parameters on thinned values (cross-key rules involve two keys)."""
    full = {p.key: _candidates(p) for p in space.params}
    if math.prod(len(v) for v in full.values()) <= MAX_COMBINATIONS:
        keys = list(full)
        for values in itertools.product(*full.values()):
            yield dict(zip(keys, values, strict=True))
        return
    for key, values in full.items():
        for value in values:
            yield {key: value}
    few = {p.key: _candidates(p, PAIR_VALUES) for p in space.params}
    for a, b in itertools.combinations(few, 2):
        for va, vb in itertools.product(few[a], few[b]):
            yield {a: va, b: vb}


def _overlaps(key: str, other: str) -> bool:
    return key == other or key.startswith(other + ".") or other.startswith(key + ".")


def _yield_to_command_line(
    source: str, entries: dict[str, Any], prefix: str, command_line: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Drop the entries a command-line override also sets: the user's value wins, said once."""
    kept: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in entries.items():
        hits = [c for c in command_line if _overlaps(prefix + key, c)]
        if hits:
            given = ", ".join(f"--{c}={command_line[c]!r}" for c in hits)
            notes.append(
                f"{given} from the command line replaces {prefix}{key}={value!r} of {source}"
            )
        else:
            kept[key] = value
    return kept, notes


def load_space(path: str | Path, base: Config, command_line: dict[str, Any] | None = None) -> Space:
    """Read and check a space file against the base config; raise SpaceError naming the key.

    `command_line` holds the dotted keys the user overrode: they replace the space's `fixed`
    and `resources` values, and a searched key given there is an error (the sweep would
    silently ignore one or the other)."""
    command_line = command_line or {}
    path = Path(path)
    source = str(path)
    spec = read_space_file(path)
    params = [_param(key, domain) for key, domain in spec.params.items()]
    resources = {k: v for k, v in draccus.encode(spec.resources).items() if v is not None}
    for param in params:
        hits = [c for c in command_line if _overlaps(param.key, c)]
        if hits:
            raise SpaceError(
                f"{source}: 'params.{param.key}' is searched by the space, but the command line "
                f"sets --{hits[0]}; remove one of the two"
            )
    fixed, fixed_notes = _yield_to_command_line(f"{source} (fixed)", spec.fixed, "", command_line)
    resources, resource_notes = _yield_to_command_line(
        f"{source} (resources)", resources, "ray.", command_line
    )
    space = Space(
        path, spec.metric, spec.mode, spec.num_samples, spec.max_concurrent_trials, params,
        spec.scheduler, spec.search.algorithm, spec.search.seed, fixed, resources,
        tuple(fixed_notes + resource_notes),
    )  # fmt: skip
    _check_against_schema(space, base)
    return space


def _check_against_schema(space: Space, base: Config) -> None:
    """Every key must be tunable and every value the domain can produce must fit the schema."""
    from raytrain_vla.models.checks import check_model_options  # torch: only when a space loads

    source = str(space.path)
    tree = base_tree(space, base)
    keys = {p.key for p in space.params}
    for param in space.params:
        if not is_tunable(param.key):
            raise SpaceError(
                f"{source}: 'params.{param.key}' is not tunable (budget, resources, logging, "
                "storage and the validation split belong to the sweep; set them under 'fixed')"
            )
        for cond in param.when:
            if cond not in keys and not _has_key(tree, cond):
                raise SpaceError(
                    f"{source}: 'params.{param.key}.when' names unknown config key '{cond}'"
                    f"{nearest_key(cond)}"
                )
    for sampled in _combinations(space):
        applied = active_params(space, sampled, tree)
        trial = copy.deepcopy(tree)
        for key, value in applied.items():
            set_dotted(trial, key, value, f"{source}: params")
        where = ", ".join(f"{k}={v!r}" for k, v in sampled.items())
        try:
            trial_cfg = from_tree(trial, f"{source}: params {where}")
            check_model_options(trial_cfg.model, trial_cfg.optimizer)
        except ConfigError as err:
            raise SpaceError(
                f"{source}: the space can sample {where}, which is not a valid config: {err}"
            ) from err


def base_tree(space: Space, base: Config) -> dict:
    """The base config with the space's `fixed` and `resources` applied, checked."""
    tree = to_dict(base)
    source = f"{space.path}: fixed"
    for key, value in space.fixed.items():
        set_dotted(tree, key, value, source)
    for key, value in space.resources.items():
        set_dotted(tree, f"ray.{key}", value, f"{space.path}: resources")
    try:
        from_tree(tree, source)
    except ConfigError as err:
        raise SpaceError(f"{source}: {err}") from err
    return tree


def active_params(space: Space, sampled: dict[str, Any], tree: dict) -> dict[str, Any]:
    """The sampled values whose `when` conditions hold (conditions see other sampled values)."""

    def current(key: str) -> Any:
        return sampled[key] if key in sampled else get_dotted(tree, key)

    return {
        p.key: sampled[p.key]
        for p in space.params
        if p.key in sampled and all(current(k) in allowed for k, allowed in p.when.items())
    }


def trial_config(space: Space, base: Config, sampled: dict[str, Any]) -> tuple[Config, dict]:
    """The validated config of one trial and the parameter values that were applied."""
    tree = base_tree(space, base)
    applied = active_params(space, sampled, tree)
    for key, value in applied.items():
        set_dotted(tree, key, value, f"{space.path}: params")
    return from_tree(tree, f"{space.path}: trial {applied}"), applied
