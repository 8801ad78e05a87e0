"""Cross-field rules that a type alone cannot express. Validation reads the config, never changes
it: defaults are filled by the loader before it runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re

import raytrain_vla.config.data_root as locate
from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.keys import get_dotted
from raytrain_vla.config.schema import Config, DataConfig

_NAME = re.compile(r"[A-Za-z0-9_.-]+")

POSITIVE_KEYS = (
    "train.steps", "train.global_batch_size", "train.micro_batch_size", "data.chunk_size",
    "train.log_interval", "train.val_interval", "train.save_interval",
    "train.max_consecutive_skipped_updates", "data.val_max_samples", "data.span_len",
    "data.shuffle_window", "data.samples_per_read_task", "data.read_tasks_per_segment",
    "ray.num_to_keep", "data.read_task_max_mb",
)  # fmt: skip


def validate(cfg: Config) -> None:
    """Raise ConfigError naming the first key whose value no run can use."""
    for key in POSITIVE_KEYS:
        if get_dotted(cfg, key) <= 0:
            raise ConfigError(
                f"bad value for '{key}': {get_dotted(cfg, key)}, expected a positive integer"
            )
    try:
        cfg.model.options.check(f"model.{cfg.model.type}")
    except ValueError as err:
        raise ConfigError(str(err)) from err
    _check_unused_families(cfg)
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
    _check_mesh(cfg.train.dp_shard, lo, hi)
    if cfg.data.image_size and (len(cfg.data.image_size) != 2 or min(cfg.data.image_size) < 1):
        raise ConfigError(
            f"bad value for 'data.image_size': {cfg.data.image_size}, expected [H, W] or []"
        )
    _check_action_clip(cfg.data)
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
    _check_metaworld_eval(cfg)
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


def _check_unused_families(cfg: Config) -> None:
    """Options given for a family the run does not use would be ignored: refuse them."""
    for name, options in cfg.model.sections.items():
        default = type(options)()
        changed = {
            f.name: getattr(options, f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) != getattr(default, f.name)
        }
        if name != cfg.model.type and changed:
            raise ConfigError(
                f"'model.{name}' options {changed} are set but 'model.type' is "
                f"{cfg.model.type!r}, so they would be ignored; remove them or set "
                f"model.type={name}"
            )


def mixture_entry_name(root: str, repo_id: str) -> str:
    """A mixture entry's default name: its directory's (or repo's) last part."""
    return (repo_id or root).rstrip("/").rsplit("/", 1)[-1]


def _check_metaworld_eval(cfg: Config) -> None:
    """eval.env=metaworld: known tasks, a step limit Meta-World allows, the extra installed.
    Its own keys are refused with eval.env=demo, which would ignore them."""
    from raytrain_vla.common.metaworld_tasks import check_max_steps, resolve_tasks
    from raytrain_vla.config.schema import EvalConfig

    ev, default = cfg.eval, EvalConfig()
    if ev.env != "metaworld":
        own = ("tasks", "max_steps", "workers")
        given = [k for k in own if getattr(ev, k) != getattr(default, k)]
        if given:
            raise ConfigError(
                f"'eval.{given[0]}' applies to eval.env=metaworld only (eval.env is {ev.env!r})"
            )
        return
    if cfg.data.mixture and ev.episodes:
        raise ConfigError(
            "eval.env=metaworld scores a policy of one dataset; with data.mixture set "
            "eval.episodes=0, or train on the Meta-World dataset alone"
        )
    try:
        if ev.tasks:
            resolve_tasks(ev.tasks)
        check_max_steps(ev.max_steps, "eval.max_steps")
    except ValueError as err:
        message = str(err)
        raise ConfigError(
            message if message.startswith("bad value") else f"bad value for 'eval.tasks': {err}"
        ) from None
    if ev.workers < 1:
        raise ConfigError(f"bad value for 'eval.workers': {ev.workers}, expected at least 1")
    if ev.episodes > 0 and importlib.util.find_spec("metaworld") is None:
        raise ConfigError(
            f"eval.env=metaworld with eval.episodes={ev.episodes} needs Meta-World: "
            "pip install 'raytrain_vla[metaworld]' (or eval.episodes=0)"
        )


def _check_action_clip(data: DataConfig) -> None:
    """[low, high] with finite low < high, on one dataset (a mixture normalises per robot)."""
    clip = data.action_clip
    if not clip:
        return
    if len(clip) != 2 or not all(math.isfinite(v) for v in clip) or not clip[0] < clip[1]:
        raise ConfigError(
            f"bad value for 'data.action_clip': {list(clip)}, expected [low, high] with "
            "low < high, or [] for actions as stored"
        )
    if data.mixture:
        raise ConfigError(
            "'data.action_clip' applies to one dataset; with data.mixture each robot keeps "
            "its own actions (leave action_clip empty)"
        )


def _check_mixture(data: DataConfig) -> None:
    """Entries name one dataset each, under distinct names, with positive weights; the mixture
    replaces data.root / data.repo_id, so giving those too is refused, never ignored."""
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
        if not _NAME.fullmatch(entry.name):
            raise ConfigError(
                f"{where}: bad 'name' {entry.name!r}, expected letters, digits, '_', '-' or '.'"
            )
    names = [e.name for e in data.mixture]
    if len(set(names)) != len(names):
        raise ConfigError(f"'data.mixture': names {names} repeat; give each dataset its own 'name'")


def _check_run_name(name: str) -> None:
    """The run directory is `ray.storage_path/run_name`; pruning and resume act inside it."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(
            f"bad value for 'ray.run_name': {name!r}, expected one directory name (no '/', '\\', "
            "and not '.' or '..'), so the run stays inside 'ray.storage_path'"
        )


def _check_mesh(dp_shard: int, lo: int, hi: int) -> None:
    """HSDP needs every world size the run may take to be whole shard groups."""
    if dp_shard < 0:
        raise ConfigError(
            f"bad value for 'train.dp_shard': {dp_shard}, expected 0 (shard across every "
            "worker) or the shard-group size"
        )
    if not dp_shard:
        return
    uneven = [w for w in range(lo, hi + 1) if w % dp_shard]
    if uneven:
        span = f"{lo}" if lo == hi else f"[{lo}, {hi}]"
        raise ConfigError(
            f"bad value for 'train.dp_shard': {dp_shard} does not divide world size "
            f"{uneven[0]} (ray.num_workers={span}); expected a divisor of every world size the "
            "run may take, or 0"
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
    _check_muon(cfg)
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


def _check_muon(cfg: Config) -> None:
    """Muon's settings apply only with optimizer.type=muon, and Muon needs what it cannot do
    without: torch.optim.Muon, and parameters on the device (not train.cpu_offload)."""
    import re

    from raytrain_vla.config.schema import MuonConfig

    muon = cfg.optimizer.muon
    if cfg.optimizer.type != "muon":
        changed = [k for k, v in vars(muon).items() if v != getattr(MuonConfig(), k)]
        if changed:
            raise ConfigError(
                f"'optimizer.muon.{changed[0]}' is set but optimizer.type is "
                f"{cfg.optimizer.type!r}; set optimizer.type=muon or drop it"
            )
        return
    import torch

    if not hasattr(torch.optim, "Muon"):
        raise ConfigError(
            f"optimizer.type=muon needs torch.optim.Muon (torch >= 2.9); this is torch "
            f"{torch.__version__}"
        )
    if cfg.train.cpu_offload:
        raise ConfigError(
            "optimizer.type=muon does not support train.cpu_offload=true (its Newton-Schulz "
            "gathers run on the device's process group); turn one of them off"
        )
    if not 0.0 <= muon.momentum < 1.0:
        raise ConfigError(
            f"bad value for 'optimizer.muon.momentum': {muon.momentum}, expected [0, 1)"
        )
    if not 1 <= muon.ns_steps < 100:
        raise ConfigError(
            f"bad value for 'optimizer.muon.ns_steps': {muon.ns_steps}, expected 1..99"
        )
    if not muon.lr_scale >= 0:
        raise ConfigError(
            f"bad value for 'optimizer.muon.lr_scale': {muon.lr_scale}, expected >= 0"
        )
    for pattern in muon.exclude_patterns:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigError(
                f"bad value for 'optimizer.muon.exclude_patterns': {pattern!r} is not a regex "
                f"({err})"
            ) from None


def check_batch_layout(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Gradient accumulation steps that keep the global batch fixed for this world size."""
    if global_batch % (world_size * micro_batch) != 0:
        raise ConfigError(
            f"'train.global_batch_size' {global_batch} must be divisible by world size {world_size} x "
            f"'train.micro_batch_size' {micro_batch}"
        )
    return global_batch // (world_size * micro_batch)
