"""Checks of a run against its dataset before Ray starts, each one line with the number that
matters: what the model will see (tokens per camera, text budget), episodes shorter than a chunk,
camera resolutions, missing files and statistics, closed-loop scoring without a simulator.

`run` and `tune` call `preflight` and stop on an error; `raytrain-vla data preflight ROOT`
prints every finding, plus the full `data inspect` (which decodes the videos' ends).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.common.uri import is_uri
from raytrain_vla.config import Config, ConfigError, dataset_configs
from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.inspect import quick_problems
from raytrain_vla.data.mixture import open_view
from raytrain_vla.models.base import InputBudget
from raytrain_vla.models.registry import get_family
from raytrain_vla.sim.closed_loop import is_demo_dataset

# Vision tokens per camera above which a run is warned (the attention cost grows with their
# square; pretrained VLAs see 64 to 256 per camera).
MANY_IMAGE_TOKENS = 1024


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning", "note"]
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def check_model_fits_data(cfg: Config) -> tuple[Any, DataSpec]:
    """On the driver, once the dataset exists: the family resolves its config against the
    dataset's shapes (cameras, dims) and builds the model on the meta device, so a camera that
    feeds nothing or a LoRA target that matches no module fails here, not on every worker.
    Returns the resolved model config and the data spec."""
    family = get_family(cfg.model.type)
    if cfg.data.image_size and not family.uses_data_image_size:
        raise ConfigError(
            f"'data.image_size': model type {family.name!r} sizes its images itself "
            f"(see model.{family.name}); leave data.image_size empty"
        )
    view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    spec = view.spec
    try:
        config = family.resolve_config(cfg.model.options, spec, cfg.model.init_from, cfg.model.lora)
        with torch.device("meta"):
            family.build(config)
        # The processor too (its tokenizer, the statistics its normalisation needs).
        family.processor(config, view.normalizer)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from err
    return config, spec


def _chunk_findings(cfg: Config) -> list[Finding]:
    """Where `data.chunk_size` came from when the family took it from `model.init_from`."""
    options = cfg.model.options
    chunk, source = options.default_chunk_size(cfg.model.init_from)
    if chunk != cfg.data.chunk_size or chunk == options.DEFAULT_CHUNK_SIZE:
        return []
    return [Finding("note", f"data.chunk_size {chunk} is {source} (give data.chunk_size to "
                    "train with another)")]  # fmt: skip


def _unused_data_findings(cfg: Config) -> list[Finding]:
    """Settings that have no effect on this run, said rather than silently dropped."""
    data, default = cfg.data, DataConfig()
    out = []
    cache_set = (data.cache_dir, data.cache_max_gb) != (default.cache_dir, default.cache_max_gb)
    roots = [one.root for one in dataset_configs(data)]
    if cache_set and not any(is_uri(r) for r in roots):
        out.append(Finding("warning", "data.cache_dir/data.cache_max_gb have no effect: they "
                           f"cache object-store files, and the data ({', '.join(roots)}) is "
                           "local"))  # fmt: skip
    plan_g = cfg.train.global_batch_size
    if data.mixture and data.read_tasks_follow_windows:
        out.append(Finding("note", "read tasks do not follow shuffle windows in a mixture: a "
                           "step's samples come from several datasets' windows"))  # fmt: skip
    elif data.read_tasks_follow_windows and data.shuffle_window < plan_g:
        out.append(Finding("note", f"read tasks do not follow shuffle windows: data.shuffle_window "
                           f"{data.shuffle_window} is below one global batch ({plan_g})"))  # fmt: skip
    return out


def _mixture_findings(cfg: Config) -> list[Finding]:
    """Each dataset's own findings, named, then the model against the mixture's layout."""
    findings, metas = [], []
    for entry, one in zip(cfg.data.mixture, dataset_configs(cfg.data), strict=True):
        sub = dataclasses.replace(cfg, data=one)
        meta = LeRobotMeta.load(one.root)
        metas.append((entry.name, sub, meta))
        own = [Finding("error", p) for p in quick_problems(meta)] + _episode_findings(sub, meta)
        findings += [Finding(f.level, f"data.mixture {entry.name!r}: {f.message}") for f in own]
    if any(f.level == "error" for f in findings):
        return findings
    try:
        config, _spec = check_model_fits_data(cfg)
    except DatasetError as err:  # e.g. cameras of different sizes without data.image_size
        return [*findings, Finding("error", str(err))]
    budget = get_family(cfg.model.type).input_budget(config)
    for name, sub, meta in metas:
        own = []
        if budget is not None:
            own = _image_token_findings(sub, meta, budget) + _text_findings(sub, meta, budget)
        findings += [Finding(f.level, f"data.mixture {name!r}: {f.message}") for f in own]
    findings += _unused_data_findings(cfg) + _chunk_findings(cfg)
    demos = [name for name, sub, _ in metas if is_demo_dataset(sub.data.root)]
    if cfg.eval.episodes > 0 and cfg.eval.env == "demo":
        findings.append(
            Finding(
                "note",
                f"eval.episodes={cfg.eval.episodes}: closed-loop scoring runs the demo task as "
                f"robot {demos[0]!r}"
                if demos
                else f"eval.episodes={cfg.eval.episodes} is skipped: closed-loop scoring runs "
                "the demo task's simulator, and no dataset of the mixture is the demo dataset "
                "(eval.episodes=0 silences this)",
            )
        )
    return findings


def preflight(cfg: Config) -> list[Finding]:
    """Every finding for this config on its dataset or mixture (the data must exist)."""
    if cfg.data.mixture:
        return _mixture_findings(cfg)
    meta = LeRobotMeta.load(cfg.data.root)
    findings = [Finding("error", p) for p in quick_problems(meta)]
    findings += _camera_findings(cfg, meta)
    if any(f.level == "error" for f in findings):
        return findings  # the model cannot be resolved against this data
    config, _spec = check_model_fits_data(cfg)
    budget = get_family(cfg.model.type).input_budget(config)
    if budget is not None:
        findings += _image_token_findings(cfg, meta, budget)
        findings += _text_findings(cfg, meta, budget)
    findings += _episode_findings(cfg, meta)
    findings += _unused_data_findings(cfg) + _chunk_findings(cfg)
    findings += _optimizer_findings(cfg, config)
    if cfg.eval.env == "metaworld":
        findings += _metaworld_findings(cfg, meta)
    elif cfg.eval.episodes > 0 and not is_demo_dataset(cfg.data.root):
        findings.append(
            Finding(
                "note",
                f"eval.episodes={cfg.eval.episodes} is skipped: closed-loop scoring runs the "
                f"demo task's simulator, and {cfg.data.root} is not the demo dataset "
                "(eval.episodes=0 silences this)",
            )
        )
    return findings


def _optimizer_findings(cfg: Config, config: Any) -> list[Finding]:
    """With optimizer.type=muon: how many tensors and parameters each optimizer updates, from
    the model built on the meta device; a warning when no matrix is left to Muon."""
    if cfg.optimizer.type != "muon":
        return []
    from raytrain_vla.train.optim import (
        build_optimizer,
        freeze_for_config,
        optimizer_summary,
        resolve_groups,
    )

    with torch.device("meta"):
        model = get_family(cfg.model.type).build(config)
    freeze_for_config(model, cfg.optimizer)
    try:
        optimizer = build_optimizer(model, resolve_groups(model, cfg.optimizer), cfg.optimizer)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    summary = optimizer_summary(optimizer)
    if not any(g.get("muon") for g in optimizer.param_groups):
        return [Finding("warning", f"optimizer.type=muon, but optimizer.muon.exclude_patterns "
                        f"leave Muon no trainable matrix ({summary})")]  # fmt: skip
    return [Finding("note", f"optimizer muon: {summary}")]


def _metaworld_findings(cfg: Config, meta: LeRobotMeta) -> list[Finding]:
    """eval.env=metaworld needs tasks to score and Meta-World's one camera, 4-D state and
    action in the data the policy learns from."""
    from raytrain_vla.common.metaworld_tasks import eval_tasks

    if cfg.eval.episodes == 0:
        return []
    try:
        tasks = eval_tasks(cfg.eval.tasks, meta.tasks)
    except ValueError as err:
        return [Finding("error", str(err))]
    shapes = (len(meta.camera_keys), meta.state_dim, meta.action_dim)
    if shapes != (1, 4, 4):
        return [
            Finding(
                "error",
                f"eval.env=metaworld: {meta.root} has {shapes[0]} camera(s), {shapes[1]}-D state "
                f"and {shapes[2]}-D actions; Meta-World's policies see 1 camera, 4-D state and "
                "4-D actions",
            )
        ]
    return [
        Finding(
            "note",
            f"eval.env=metaworld: {cfg.eval.episodes} episodes of each of {len(tasks)} tasks "
            f"({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''}) at the end of the run",
        )
    ]


def _camera_findings(cfg: Config, meta: LeRobotMeta) -> list[Finding]:
    """Cameras of different resolutions need one size for the model: `data.image_size`."""
    family = get_family(cfg.model.type)
    shapes = {key: meta.camera_shape(key)[1:] for key in meta.camera_keys}
    if len(set(shapes.values())) < 2 or cfg.data.image_size or not family.uses_data_image_size:
        return []
    listed = ", ".join(f"{k} {h}x{w}" for k, (h, w) in shapes.items())
    return [
        Finding(
            "error",
            f"cameras have different resolutions ({listed}); set data.image_size=[H, W] to "
            f"resize them all (e.g. {_suggest_size(min(shapes.values()), 8, 256)})",
        )
    ]


def _suggest_size(hw: tuple[int, int], pixels_per_token: int, tokens: int) -> list[int]:
    """The largest [H, W] with the camera's aspect ratio that gives at most `tokens` tokens."""
    h, w = hw
    scale = min(1.0, math.sqrt(tokens / max(1.0, (h / pixels_per_token) * (w / pixels_per_token))))
    return [max(pixels_per_token, int(h * scale) // pixels_per_token * pixels_per_token),
            max(pixels_per_token, int(w * scale) // pixels_per_token * pixels_per_token)]  # fmt: skip


def _image_token_findings(cfg: Config, meta: LeRobotMeta, budget: InputBudget) -> list[Finding]:
    h, w = budget.image_size
    cams = len(meta.camera_keys)
    text = (
        f"the model sees each camera at {h}x{w}: {budget.tokens_per_camera} vision tokens per "
        f"camera, {cams * budget.tokens_per_camera} per sample ({cams} camera(s))"
    )
    if budget.tokens_per_camera <= MANY_IMAGE_TOKENS:
        return [Finding("note", text)]
    size = _suggest_size((h, w), budget.pixels_per_token, 256)
    return [Finding("warning", f"{text}; data.image_size={size} would give about 256")]


def _text_findings(cfg: Config, meta: LeRobotMeta, budget: InputBudget) -> list[Finding]:
    lengths = [budget.count_text(task) for task in meta.tasks]
    if not lengths:
        return []
    longest = int(np.argmax(lengths))
    task = meta.tasks[longest]
    over = sum(n > budget.text_budget for n in lengths)
    unit = budget.text_unit
    if not over:
        return [
            Finding(
                "note",
                f"longest instruction: {lengths[longest]} of the model's {budget.text_budget} "
                f"{unit}",
            )
        ]
    key = budget.text_budget_key
    text = (
        f"{over} of {len(lengths)} instructions are longer than the model's text budget of "
        f"{budget.text_budget} {unit} (the longest, {lengths[longest]} {unit}: {task[:60]!r}"
        f"{'...' if len(task) > 60 else ''})"
    )
    if cfg.model.truncate_text:
        return [Finding("warning", f"{text}; they are cut to {budget.text_budget} {unit}")]
    return [
        Finding(
            "error",
            f"{text}: raise {key} to {lengths[longest]}, or set model.truncate_text=true to cut "
            "them (two instructions that differ only after the cut become the same input)",
        )
    ]


def _episode_findings(cfg: Config, meta: LeRobotMeta) -> list[Finding]:
    lengths = np.asarray(meta.episode_length)
    short = np.flatnonzero(lengths < cfg.data.chunk_size)
    if not len(short):
        return []
    return [
        Finding(
            "warning",
            f"{len(short)} of {meta.num_episodes} episodes are shorter than data.chunk_size "
            f"{cfg.data.chunk_size} (shortest: episode {int(short[np.argmin(lengths[short])])}, "
            f"{int(lengths[short].min())} frames); every chunk in them is padded past the end",
        )
    ]


def check_before_ray(cfg: Config) -> None:
    """Print the notes and warnings; refuse (ConfigError, exit 2) on the first error."""
    from raytrain_vla.config import ConfigError

    findings = preflight(cfg)
    for finding in findings:
        if finding.level != "error":
            print(finding)
    errors = [f.message for f in findings if f.level == "error"]
    if errors:
        more = (
            f" (and {len(errors) - 1} more: raytrain-vla data preflight {cfg.data.root})"
            if len(errors) > 1
            else ""
        )
        raise ConfigError(errors[0] + more)
