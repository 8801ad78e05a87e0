"""Sweep space files: parse, validate against the config schema, and apply sampled values.

Pure Python (no Ray): a bad space file is refused, with the file and key named, before any
trial starts. The format is documented in `tune_spaces/README.md`.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytrain_vla.config import Config, ConfigError, from_tree, to_dict
from raytrain_vla.config.loader import RESUMABLE_KEYS, read_yaml_mapping, valid_keys

# Domain name -> number of arguments (None: a non-empty list of values).
DOMAINS: dict[str, int | None] = {
    "loguniform": 2,
    "uniform": 2,
    "quniform": 3,
    "randint": 2,
    "choice": None,
    "grid": None,
}
SCHEDULERS = ("asha", "median", "none")
ALGORITHMS = ("random", "optuna")
METRICS = ("val_action_mse", "val_action_l1", "val_loss", "val_mse_ratio")
TOP_LEVEL = (
    "metric",
    "mode",
    "num_samples",
    "max_concurrent_trials",
    "resources",
    "fixed",
    "scheduler",
    "search",
    "params",
)
# Recipe keys that define what the metric measures: tuning them would compare different things.
NOT_TUNABLE = ("data.val_fraction", "data.val_episodes", "data.demo_episodes", "data.demo_seed")
GROUP_PREFIX = "optimizer.groups."
# How many sampled values and combinations a space is checked with before any trial starts.
MAX_VALUES_PER_PARAM = 64
MAX_COMBINATIONS = 256
PAIR_VALUES = 4


class SpaceError(ConfigError):
    """A space file that cannot be swept; the message names the file and key."""


@dataclass(frozen=True)
class Param:
    key: str
    domain: str
    args: tuple
    # Active only when every named key has one of the listed values (others keep the default).
    when: dict[str, tuple] = field(default_factory=dict)


@dataclass
class SchedulerSpec:
    type: str = "asha"
    # Steps a trial always runs before it can be stopped; 0 means one validation interval.
    grace_period: int = 0
    reduction_factor: float = 2.0
    # Median stopping: trials that must report before the median is trusted.
    min_samples_required: int = 3


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
    """Set `a.b.c` in a config tree; `optimizer.groups.NAME.FIELD` addresses a group by name."""
    if key.startswith(GROUP_PREFIX):
        parts = key[len(GROUP_PREFIX) :].split(".")
        groups = tree["optimizer"]["groups"]
        names = [g["name"] for g in groups]
        if len(parts) != 2 or parts[0] not in names:
            raise SpaceError(
                f"{source}: unknown key '{key}': LR groups are addressed as "
                f"'optimizer.groups.NAME.FIELD' with NAME one of {names}"
            )
        group = groups[names.index(parts[0])]
        if parts[1] not in group or parts[1] in ("name", "patterns"):
            raise SpaceError(f"{source}: '{key}': a group's tunable fields are lr, weight_decay")
        group[parts[1]] = _like(group[parts[1]], value)
        return
    if key not in valid_keys():
        raise SpaceError(f"{source}: unknown config key '{key}'{_nearest_key(key)}")
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = _like(node.get(parts[-1]), value)


def _like(current: Any, value: Any) -> Any:
    """Tune's quniform yields floats; a whole float for an int field becomes an int."""
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return value


def _nearest_key(key: str) -> str:
    match = difflib.get_close_matches(key, valid_keys(), n=1, cutoff=0.0)
    return f" (did you mean '{match[0]}'?)" if match else ""


def get_dotted(tree: dict, key: str) -> Any:
    if key.startswith(GROUP_PREFIX):
        name, field_name = key[len(GROUP_PREFIX) :].split(".")
        return next(g[field_name] for g in tree["optimizer"]["groups"] if g["name"] == name)
    node = tree
    for part in key.split("."):
        node = node[part]
    return node


def _has_key(tree: dict, key: str) -> bool:
    try:
        get_dotted(tree, key)
    except (KeyError, StopIteration, ValueError, TypeError):
        return False
    return True


def is_tunable(key: str) -> bool:
    """Recipe keys only: budget, resources, logging and storage are the sweep's, not a trial's."""
    if key.startswith(GROUP_PREFIX):
        return True
    blocked = RESUMABLE_KEYS + NOT_TUNABLE
    return not any(key == k or key.startswith(k + ".") for k in blocked)


def _require(cond: bool, source: str, key: str, expected: str, got: Any) -> None:
    if not cond:
        raise SpaceError(f"{source}: bad value for '{key}': {got!r}, expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _positive_int(raw: dict, key: str, source: str) -> int:
    value = raw.get(key, 1)
    _require(_is_int(value) and value > 0, source, key, "a positive integer", value)
    return value


def _parse_param(source: str, key: str, spec: Any) -> Param:
    where = f"params.{key}"
    _require(isinstance(spec, dict), source, where, "a mapping like {loguniform: [lo, hi]}", spec)
    when = spec.get("when", {})
    domains = [k for k in spec if k != "when"]
    _require(
        len(domains) == 1 and domains[0] in DOMAINS,
        source,
        where,
        f"exactly one domain of {list(DOMAINS)} (plus an optional 'when')",
        spec,
    )
    domain = domains[0]
    args = spec[domain]
    count = DOMAINS[domain]
    _require(
        isinstance(args, list) and (len(args) == count if count else len(args) > 0),
        source,
        f"{where}.{domain}",
        f"a list of {count} numbers" if count else "a non-empty list of values",
        args,
    )
    if count:
        numeric = all(_is_number(a) for a in args)
        _require(
            numeric and args[0] < args[1],
            source,
            f"{where}.{domain}",
            "[lo, hi] with lo < hi",
            args,
        )
        if domain == "loguniform":
            _require(args[0] > 0, source, f"{where}.{domain}", "0 < lo < hi", args)
        if domain == "randint":
            _require(
                all(isinstance(a, int) for a in args), source, f"{where}.{domain}", "integers", args
            )
        if domain == "quniform":
            _require(args[2] > 0, source, f"{where}.{domain}", "a positive step q", args)
    _require(isinstance(when, dict), source, f"{where}.when", "a mapping of key: value(s)", when)
    conditions = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when.items()}
    return Param(key, domain, tuple(args), conditions)


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
    raw = read_yaml_mapping(path, "space file", "a mapping", SpaceError)
    for key in raw:
        if key not in TOP_LEVEL:
            raise SpaceError(f"{source}: unknown key '{key}', expected one of {list(TOP_LEVEL)}")
    metric = raw.get("metric", "val_action_mse")
    _require(metric in METRICS, source, "metric", f"one of {list(METRICS)}", metric)
    mode = raw.get("mode", "min")
    _require(mode in ("min", "max"), source, "mode", "min or max", mode)
    num_samples = _positive_int(raw, "num_samples", source)
    concurrent = _positive_int(raw, "max_concurrent_trials", source)

    sched_raw = raw.get("scheduler", {"type": "none"})
    _require(isinstance(sched_raw, dict), source, "scheduler", "a mapping", sched_raw)
    fields = SchedulerSpec.__dataclass_fields__
    for key in sched_raw:
        if key not in fields:
            raise SpaceError(
                f"{source}: unknown key 'scheduler.{key}', expected one of {list(fields)}"
            )
    scheduler = SchedulerSpec(**sched_raw)
    _require(
        scheduler.type in SCHEDULERS,
        source,
        "scheduler.type",
        f"one of {list(SCHEDULERS)}",
        scheduler.type,
    )
    _require(
        _is_int(scheduler.grace_period) and scheduler.grace_period >= 0,
        source,
        "scheduler.grace_period",
        "an integer number of steps >= 0",
        scheduler.grace_period,
    )
    _require(
        _is_number(scheduler.reduction_factor) and scheduler.reduction_factor > 1,
        source,
        "scheduler.reduction_factor",
        "a number > 1",
        scheduler.reduction_factor,
    )
    _require(
        _is_int(scheduler.min_samples_required) and scheduler.min_samples_required > 0,
        source,
        "scheduler.min_samples_required",
        "a positive integer",
        scheduler.min_samples_required,
    )

    search = raw.get("search", {})
    _require(
        isinstance(search, dict) and set(search) <= {"algorithm", "seed"},
        source,
        "search",
        "a mapping with 'algorithm' and 'seed'",
        search,
    )
    algorithm = search.get("algorithm", "random")
    _require(
        algorithm in ALGORITHMS, source, "search.algorithm", f"one of {list(ALGORITHMS)}", algorithm
    )
    seed = search.get("seed")
    _require(seed is None or _is_int(seed), source, "search.seed", "an integer", seed)

    params_raw = raw.get("params", {})
    _require(
        isinstance(params_raw, dict) and params_raw,
        source,
        "params",
        "a non-empty mapping of dotted config keys to domains",
        params_raw,
    )
    params = [_parse_param(source, key, spec) for key, spec in params_raw.items()]

    fixed = raw.get("fixed", {}) or {}
    _require(
        isinstance(fixed, dict), source, "fixed", "a mapping of dotted config keys to values", fixed
    )
    resources = raw.get("resources", {}) or {}
    allowed = {"num_workers", "resources_per_worker", "use_gpu"}
    _require(
        isinstance(resources, dict) and set(resources) <= allowed,
        source,
        "resources",
        f"a mapping with keys from {sorted(allowed)}",
        resources,
    )

    for param in params:
        hits = [c for c in command_line if _overlaps(param.key, c)]
        if hits:
            raise SpaceError(
                f"{source}: 'params.{param.key}' is searched by the space, but the command line "
                f"sets --{hits[0]}; remove one of the two"
            )
    fixed, fixed_notes = _yield_to_command_line(f"{source} (fixed)", fixed, "", command_line)
    resources, resource_notes = _yield_to_command_line(
        f"{source} (resources)", resources, "ray.", command_line
    )
    space = Space(
        path, metric, mode, num_samples, concurrent, params, scheduler,
        algorithm, search.get("seed"), fixed, resources, tuple(fixed_notes + resource_notes),
    )  # fmt: skip
    if algorithm == "optuna" and space.has_grid():
        key = next(p.key for p in params if p.domain == "grid")
        raise SpaceError(f"{source}: 'params.{key}': grid domains need search.algorithm: random")
    _check_against_schema(space, base)
    return space


def _check_against_schema(space: Space, base: Config) -> None:
    """Every key must be tunable and every value the domain can produce must fit the schema."""
    from raytrain_vla.train.optim import check_model_options  # torch: only when a space loads

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
                    f"{_nearest_key(cond)}"
                )
    for sampled in _combinations(space):
        applied = active_params(space, sampled, tree)
        trial = copy.deepcopy(tree)
        for key, value in applied.items():
            set_dotted(trial, key, value, f"{source}: params")
        where = ", ".join(f"{k}={v!r}" for k, v in sampled.items())
        try:
            check_model_options(from_tree(trial, f"{source}: params {where}"))
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
