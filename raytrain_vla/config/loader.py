"""Load the config tree from packaged defaults, a YAML file and `--dotted.key=value` overrides.

draccus does the decoding; this module adds what users need on top: errors that name the key and
the nearest valid key, and a stable hash over the recipe.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import re
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import draccus
import yaml

import raytrain_vla.config.data_root as locate
from raytrain_vla.common.uri import is_uri
from raytrain_vla.config.schema import Config, DataConfig
from raytrain_vla.errors import NotRetriable

_NAME = re.compile(r"[A-Za-z0-9_.-]+")

DEFAULT_CONFIG = "default.yaml"


class ConfigError(NotRetriable, ValueError):
    """A config file or override that does not fit the schema; the message names the key."""


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """The fields' resolved types (not ClassVars), once per schema class: a sweep's space check
    decodes hundreds of configs."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def valid_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key the schema accepts (sections and leaves)."""
    keys: list[str] = []
    for name, tp in _field_types(cls).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if dataclasses.is_dataclass(tp):
            keys.extend(valid_keys(tp, key + "."))
    return keys


# Keys of earlier versions: an old config file gets told where the key went.
MOVED_KEYS = {
    "model.size": "model.flow_vla.size",
    "model.max_text_len": "model.flow_vla.max_text_len",
    "model.num_inference_steps": "model.flow_vla.num_inference_steps",
}
REMOVED_KEYS = {"data.preload": "it never had an effect; remove it"}


def _nearest(key: str) -> str:
    if key in MOVED_KEYS:
        return f" (it moved to '{MOVED_KEYS[key]}')"
    if key in REMOVED_KEYS:
        return f" ({REMOVED_KEYS[key]})"
    match = difflib.get_close_matches(key, valid_keys(), n=1, cutoff=0.0)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _check_keys(tree: dict, cls: type, prefix: str, source: str) -> None:
    """Reject unknown keys before decoding, so the message can point at the nearest valid key."""
    types = _field_types(cls)
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if name not in types:
            raise ConfigError(f"{source}: unknown key '{key}'{_nearest(key)}")
        if dataclasses.is_dataclass(types[name]):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{key}' must be a mapping of its fields")
            _check_keys(value, types[name], key + ".", source)


def _packaged_default() -> dict:
    text = resources.files("raytrain_vla.config").joinpath(DEFAULT_CONFIG).read_text()
    return yaml.safe_load(text) or {}


def read_yaml_mapping(
    path: str | Path, kind: str, expected: str, error: type[ConfigError] = ConfigError
) -> dict:
    """A YAML file whose top level is a mapping; `error` names the file and what went wrong."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {kind} not found")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(tree, dict):
        raise error(f"{path}: expected {expected} at the top level")
    return tree


def _read_yaml(path: str | Path) -> dict:
    return read_yaml_mapping(path, "config file", "a mapping of config sections")


def _merge(base: dict, update: dict, cls: type = Config) -> dict:
    """`update` over `base`: sections merge key by key, every other value (a mapping such as
    `ray.resources_per_worker` included) is replaced whole, as the user wrote it."""
    out = dict(base)
    types = _field_types(cls)
    for key, value in update.items():
        section = types.get(key)
        if (
            isinstance(value, dict)
            and isinstance(out.get(key), dict)
            and dataclasses.is_dataclass(section)
        ):
            out[key] = _merge(out[key], value, section)
        else:
            out[key] = value
    return out


def _parse_overrides(args: list[str]) -> dict:
    """Turn `--a.b=c` (or `--a.b c`) into a nested dict; values are parsed as YAML scalars."""
    tree: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"unexpected argument '{arg}': overrides look like --section.key=value"
            )
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, raw = arg[2:], args[i + 1]
            i += 1
        else:
            raise ConfigError(f"override '{arg}' has no value: use --{arg[2:]}=VALUE")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '--{key}' conflicts with another override")
        node[parts[-1]] = value
        i += 1
    return tree


def from_tree(tree: dict, source: str = "config") -> Config:
    """Decode a plain nested dict into the typed tree, with one-line errors naming the key."""
    _check_keys(tree, Config, "", source)
    try:
        cfg = draccus.decode(Config, tree)
    except draccus.utils.DecodingError as err:
        key = ".".join(str(p) for p in err.key_path) or "<root>"
        detail = _choices_detail(tree, err.key_path) or " ".join(str(err.message).split())
        raise ConfigError(f"{source}: bad value for '{key}': {detail}") from err
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {' '.join(str(err).split())}") from err
    if "chunk_size" not in (tree.get("data") or {}):
        cfg.data.chunk_size = getattr(cfg.model, cfg.model.type).DEFAULT_CHUNK_SIZE
    validate(cfg)
    return cfg


def load_config(
    config_path: str | Path | None = None, overrides: list[str] | None = None
) -> Config:
    """Packaged defaults, then the YAML file, then CLI overrides, decoded and validated."""
    tree = _packaged_default()
    source = "default config"
    if config_path:
        file_tree = _read_yaml(config_path)
        _check_keys(file_tree, Config, "", str(config_path))
        tree = _merge(tree, file_tree)
        source = str(config_path)
    if overrides:
        override_tree = _parse_overrides(overrides)
        _check_keys(override_tree, Config, "", "command line")
        tree = _merge(tree, override_tree)
        source = "command line" if not config_path else f"{config_path} + command line"
    return from_tree(tree, source)


def parse_cli(argv: list[str]) -> Config:
    """`--config PATH` plus dotted overrides."""
    return load_config(*split_cli(argv))


def command_line_keys(argv: list[str]) -> dict[str, Any]:
    """The dotted keys (leaves, or whole mappings) the overrides in `argv` set, with values."""
    out: dict[str, Any] = {}

    def walk(tree: dict, prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[prefix + key] = value

    walk(_parse_overrides(split_cli(argv)[1]), "")
    return out


def split_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """(`--config PATH` or None, the dotted overrides)."""
    config_path = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a path")
            config_path = argv[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return config_path, rest


def _choices_detail(tree: dict, key_path: tuple) -> str:
    """`'huge', expected one of ('tiny', 'small', 'base')` when the key is a Literal field."""
    cls: Any = Config
    value: Any = tree
    for part in key_path:
        if dataclasses.is_dataclass(cls):
            cls = _field_types(cls).get(str(part))
        elif typing.get_origin(cls) is dict:  # e.g. normalization_per_feature.<feature>
            cls = typing.get_args(cls)[1]
        else:
            return ""
        value = value.get(part) if isinstance(value, dict) else None
    literals = [a for a in typing.get_args(cls) if typing.get_origin(a) is typing.Literal]
    if literals:  # an optional choice: `Literal[...] | None`
        cls = literals[0]
    if typing.get_origin(cls) is typing.Literal:
        return f"{value!r}, expected one of {typing.get_args(cls)}"
    return ""


def _get(cfg: Config, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def validate(cfg: Config) -> None:
    """Cross-field rules that a type alone cannot express."""
    positive = [
        "train.steps",
        "train.global_batch_size",
        "train.micro_batch_size",
        "data.chunk_size",
    ]
    positive += ["train.log_interval", "train.val_interval", "train.save_interval"]
    positive += ["model.flow_vla.max_text_len", "model.flow_vla.num_inference_steps"]
    positive += ["train.max_consecutive_skipped_updates"]
    positive += ["data.val_max_samples", "data.span_len", "data.shuffle_window"]
    positive += ["data.samples_per_read_task", "data.read_tasks_per_segment", "ray.num_to_keep"]
    positive += ["data.read_task_max_mb"]
    for key in positive:
        if _get(cfg, key) <= 0:
            raise ConfigError(
                f"bad value for '{key}': {_get(cfg, key)}, expected a positive integer"
            )
    if not cfg.data.cache_max_gb >= 0:  # also NaN
        raise ConfigError(
            f"bad value for 'data.cache_max_gb': {cfg.data.cache_max_gb}, expected GiB >= 0 "
            "(0 turns the object-store cache off)"
        )
    fraction = cfg.data.val_fraction  # explicit `val_episodes` win over it
    if not 0.0 <= fraction < 1.0 or (fraction == 0.0 and not cfg.data.val_episodes):
        raise ConfigError(
            f"bad value for 'data.val_fraction': {cfg.data.val_fraction}, expected (0, 1) "
            "(no held-out episodes leaves every validation metric NaN), or list "
            "'data.val_episodes'"
        )
    _check_run_name(cfg.ray.run_name)
    _check_optimization(cfg)
    workers = cfg.ray.num_workers
    lo, hi = (workers, workers) if isinstance(workers, int) else workers
    if lo < 1 or hi < lo:
        raise ConfigError(f"bad value for 'ray.num_workers': {workers}, expected N or [min, max]")
    for w in range(lo, hi + 1):
        check_batch_layout(cfg.train.global_batch_size, cfg.train.micro_batch_size, w)
    if cfg.data.image_size and (len(cfg.data.image_size) != 2 or min(cfg.data.image_size) < 1):
        raise ConfigError(
            f"bad value for 'data.image_size': {cfg.data.image_size}, expected [H, W] or []"
        )
    if cfg.ray.resources_per_worker.get("GPU", 0) > 0 and not cfg.ray.use_gpu:
        raise ConfigError(
            f"'ray.resources_per_worker' {cfg.ray.resources_per_worker} asks for a GPU but "
            "'ray.use_gpu' is false; set ray.use_gpu=true or leave GPU out"
        )
    if cfg.ray.elastic_resize_monitor_interval_s <= 0 or cfg.debug.step_delay_s < 0:
        raise ConfigError(
            "bad value for 'ray.elastic_resize_monitor_interval_s' or 'debug.step_delay_s': "
            f"{cfg.ray.elastic_resize_monitor_interval_s}, {cfg.debug.step_delay_s}; expected a "
            "positive interval and a non-negative delay"
        )
    if min(cfg.eval.episodes, cfg.eval.rollouts_logged, cfg.eval.n_action_steps) < 0:
        raise ConfigError(
            "bad value for 'eval.episodes', 'eval.rollouts_logged' or 'eval.n_action_steps': "
            f"{cfg.eval.episodes}, {cfg.eval.rollouts_logged}, {cfg.eval.n_action_steps}; "
            "expected non-negative integers"
        )
    if cfg.eval.n_action_steps > cfg.data.chunk_size:
        raise ConfigError(
            f"bad value for 'eval.n_action_steps': {cfg.eval.n_action_steps}, expected at most "
            f"data.chunk_size ({cfg.data.chunk_size})"
        )
    lora = cfg.model.lora
    if lora.r < 0 or lora.alpha <= 0 or not 0.0 <= lora.dropout < 1.0 or not lora.target_modules:
        raise ConfigError(
            f"bad value for 'model.lora': {lora}; expected r >= 0, alpha > 0, dropout in [0, 1) "
            "and at least one target module"
        )
    _check_mixture(cfg.data)
    names = [g.name for g in cfg.optimizer.groups]
    if len(set(names)) != len(names) or any(not n for n in names):
        raise ConfigError(
            f"bad value for 'optimizer.groups': names must be unique and non-empty, got {names}"
        )


def _check_mixture(data: DataConfig) -> None:
    """Entries name one dataset each, under distinct names, with positive weights; the mixture
    replaces data.root / data.repo_id, so giving those too is refused, never ignored. Empty
    names become the dataset directory's (or repo's) name."""
    if not data.mixture:
        return
    if data.root != locate.DEMO or data.repo_id:
        raise ConfigError(
            f"'data.mixture' and 'data.root'/'data.repo_id' ({data.root!r}, {data.repo_id!r}) "
            "both name the data; put every dataset in data.mixture"
        )
    for i, entry in enumerate(data.mixture):
        where = f"'data.mixture[{i}]'"
        if bool(entry.root) == bool(entry.repo_id):
            raise ConfigError(f"{where}: give exactly one of 'root' and 'repo_id'")
        if not (entry.weight > 0 and math.isfinite(entry.weight)):
            raise ConfigError(f"{where}: bad 'weight' {entry.weight}, expected a positive number")
        if not entry.name:
            entry.name = (entry.repo_id or entry.root).rstrip("/").rsplit("/", 1)[-1]
        if not _NAME.fullmatch(entry.name):
            raise ConfigError(
                f"{where}: bad 'name' {entry.name!r}, expected letters, digits, '_', '-' or '.'"
            )
    names = [e.name for e in data.mixture]
    if len(set(names)) != len(names):
        raise ConfigError(f"'data.mixture': names {names} repeat; give each dataset its own 'name'")


def dataset_configs(data: DataConfig) -> list[DataConfig]:
    """One data config per dataset: `data` itself, or one per mixture entry (its root, every
    other key shared)."""
    if not data.mixture:
        return [data]
    return [
        dataclasses.replace(data, root=e.root or locate.DEMO, repo_id=e.repo_id, mixture=[])
        for e in data.mixture
    ]


def _check_run_name(name: str) -> None:
    """The run directory is `ray.storage_path/run_name`; pruning and resume act inside it."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(
            f"bad value for 'ray.run_name': {name!r}, expected one directory name (no '/', '\\', "
            "and not '.' or '..'), so the run stays inside 'ray.storage_path'"
        )


def _check_optimization(cfg: Config) -> None:
    """Values that would train silently wrong or fail only inside a worker after Ray started."""
    opt = cfg.optimizer
    rates = [("optimizer.lr", opt.lr, opt.weight_decay)]
    rates += [(f"optimizer.groups[{g.name}].lr", g.lr, g.weight_decay) for g in opt.groups]
    for key, lr, weight_decay in rates:
        if not lr >= 0:  # also NaN; 0 is allowed (a run that must leave weights as loaded)
            raise ConfigError(
                f"bad value for '{key}': {lr}, expected a learning rate >= 0 (keep a role fixed "
                "with 'optimizer.freeze_roles')"
            )
        if not weight_decay >= 0:
            decay_key = key.removesuffix(".lr") + ".weight_decay"
            raise ConfigError(f"bad value for '{decay_key}': {weight_decay}, expected >= 0")
    if len(opt.betas) != 2 or not all(0.0 <= b < 1.0 for b in opt.betas) or not opt.eps > 0:
        raise ConfigError(
            f"bad value for 'optimizer.betas' or 'optimizer.eps': {opt.betas}, {opt.eps}; "
            "expected two betas in [0, 1) and eps > 0"
        )
    sched = cfg.scheduler
    if not 0.0 <= sched.min_lr_ratio <= 1.0:
        raise ConfigError(
            f"bad value for 'scheduler.min_lr_ratio': {sched.min_lr_ratio}, expected [0, 1]"
        )
    if sched.warmup_steps < 0:
        raise ConfigError(
            f"bad value for 'scheduler.warmup_steps': {sched.warmup_steps}, expected >= 0"
        )
    if not cfg.train.grad_clip >= 0:
        raise ConfigError(
            f"bad value for 'train.grad_clip': {cfg.train.grad_clip}, expected >= 0 (0 turns "
            "clipping off)"
        )


def check_batch_layout(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Gradient accumulation steps that keep the global batch fixed for this world size."""
    if global_batch % (world_size * micro_batch) != 0:
        raise ConfigError(
            f"'train.global_batch_size' {global_batch} must be divisible by world size {world_size} x "
            f"'train.micro_batch_size' {micro_batch}"
        )
    return global_batch // (world_size * micro_batch)


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
    """Resolve local paths where the user typed them: Ray workers run in their own directories."""
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
    if cfg.model.smolvla.vlm_path:
        vlm_path = str(Path(cfg.model.smolvla.vlm_path).expanduser().resolve())
        cfg.model.smolvla = dataclasses.replace(cfg.model.smolvla, vlm_path=vlm_path)
    return cfg


def to_dict(cfg: Config) -> dict:
    """Plain JSON/YAML-safe tree (tuples become lists)."""
    return json.loads(json.dumps(draccus.encode(cfg)))


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# Keys that may differ between a run and its resume without changing the recipe.
RESUMABLE_KEYS = (
    "ray",
    "logging",
    "eval",
    "debug",
    "train.steps",
    "train.max_consecutive_skipped_updates",
    "train.micro_batch_size",
    "train.activation_checkpointing",
    "train.peak_tflops",
    "train.cpu_offload",
    "train.reshard_after_forward",
    "train.log_interval",
    "train.val_interval",
    "train.save_interval",
    "data.root",
    "data.repo_id",
    "model.truncate_text",  # only decides whether a too-long instruction is refused
    "data.write_demo_if_missing",
    "data.read_tasks_per_segment",
    "data.samples_per_read_task",
    "data.read_tasks_follow_windows",
    "data.read_task_max_mb",
    "data.cache_dir",
    "data.cache_max_gb",
    "data.val_max_samples",
)


def recipe_hash(cfg: Config) -> str:
    """Hash over everything that changes the math; resume compares it. A mixture's datasets
    may move as data.root may (their fingerprints are compared); names and weights count."""
    tree = to_dict(cfg)
    for entry in tree["data"].get("mixture", []):
        entry.pop("root", None)
        entry.pop("repo_id", None)
    for key in RESUMABLE_KEYS:
        parts = key.split(".")
        node = tree
        for part in parts[:-1]:
            node = node[part]
        node.pop(parts[-1], None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]
