"""LR groups by parameter role or regex, freezing by role, AdamW or Muon, and the LR schedule.

Groups are resolved on parameter names before sharding, so a group means the same parameters on
every rank and at every world size. Roles come from the model family (`VLAModel.role_of`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import nn

from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig
from raytrain_vla.models.base import VLAModel
from raytrain_vla.models.checks import frozen_roles

DEFAULT_GROUP = "default"


@dataclass
class ParamGroup:
    name: str
    param_names: list[str]
    lr: float
    weight_decay: float


def freeze_for_config(model: VLAModel, cfg: OptimizerConfig) -> list[str]:
    """Freeze the parameters of the frozen roles and those the model's own config freezes;
    returns the names of every frozen parameter."""
    roles = set(frozen_roles(cfg, model.ROLE_PREFIXES))
    own = model.frozen_parameters()
    frozen = []
    for name, param in model.named_parameters():
        if model.role_of(name) in roles or name in own:
            param.requires_grad_(False)
        if not param.requires_grad:
            frozen.append(name)
    return frozen


def resolve_groups(model: VLAModel, cfg: OptimizerConfig) -> list[ParamGroup]:
    """A parameter joins the first group whose roles or patterns match it; unclaimed trainable
    parameters go to the default group.

    A configured group that matches no parameter is an error (almost always a typo); one whose
    parameters are all frozen is dropped.
    """
    compiled = [(g, [re.compile(p) for p in g.patterns], set(g.roles)) for g in cfg.groups]
    groups = {g.name: ParamGroup(g.name, [], g.lr, g.weight_decay) for g in cfg.groups}
    default = ParamGroup(DEFAULT_GROUP, [], cfg.lr, cfg.weight_decay)
    matched = set()
    for name, param in model.named_parameters():
        role = model.role_of(name)
        target = default
        for group_cfg, patterns, roles in compiled:
            if role in roles or any(p.search(name) for p in patterns):
                target = groups[group_cfg.name]
                matched.add(group_cfg.name)
                break
        if param.requires_grad:
            target.param_names.append(name)
    empty = [name for name in groups if name not in matched]
    if empty:
        raise ValueError(
            f"optimizer.groups {empty} match no parameter; check their 'roles' "
            f"{list(model.ROLE_PREFIXES)} and 'patterns'"
        )
    out = [g for g in groups.values() if g.param_names]
    if default.param_names:
        out.append(default)
    return out


def build_optimizer(
    model: nn.Module, groups: list[ParamGroup], cfg: OptimizerConfig
) -> torch.optim.Optimizer:
    """AdamW over the LR groups; with `type=muon`, each group's hidden matrices go to Muon (a
    torch group `<name>/muon`, at `lr_scale` times the group's LR) and the rest to AdamW."""
    params = dict(model.named_parameters())
    if cfg.type == "muon":
        return _build_muon(model, params, groups, cfg)
    torch_groups = [
        {
            "params": [params[n] for n in g.param_names],
            "lr": g.lr,
            "weight_decay": g.weight_decay,
            "name": g.name,
        }
        for g in groups
    ]
    # foreach: one multi-tensor kernel per group; per-parameter DTensor dispatch is slow.
    return torch.optim.AdamW(
        torch_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=True
    )


def _build_muon(
    model: nn.Module, params: dict, groups: list[ParamGroup], cfg: OptimizerConfig
) -> torch.optim.Optimizer:
    from raytrain_vla.train.muon import MuonAdamW, muon_parameter_names
    from raytrain_vla.train.newton_schulz import NewtonSchulz

    muon = muon_parameter_names(model, cfg.muon.exclude_patterns)
    torch_groups = []
    for g in groups:
        matrices = [n for n in g.param_names if n in muon]
        rest = [n for n in g.param_names if n not in muon]
        if rest:
            torch_groups.append(
                {"params": [params[n] for n in rest], "lr": g.lr,
                 "weight_decay": g.weight_decay, "name": g.name}
            )  # fmt: skip
        if matrices:
            torch_groups.append(
                {"params": [params[n] for n in matrices], "lr": g.lr * cfg.muon.lr_scale,
                 "weight_decay": g.weight_decay, "name": f"{g.name}/muon", "muon": True}
            )  # fmt: skip
    return MuonAdamW(
        torch_groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
        momentum=cfg.muon.momentum, nesterov=cfg.muon.nesterov,
        newton_schulz=NewtonSchulz(
            steps=cfg.muon.ns_steps, dtype=getattr(torch, cfg.muon.ns_dtype)
        ),
        adjust_lr=cfg.muon.adjust_lr,
    )  # fmt: skip


def optimizer_summary(optimizer: torch.optim.Optimizer) -> str:
    """Which optimizer updates how many tensors and parameters (rank 0 prints it)."""
    counts: dict[str, list[int]] = {}
    for group in optimizer.param_groups:
        kind = "muon" if group.get("muon") else "adamw"
        tensors, numel = counts.setdefault(kind, [0, 0])
        counts[kind] = [
            tensors + len(group["params"]),
            numel + sum(p.numel() for p in group["params"]),
        ]
    return ", ".join(f"{k}: {t} tensors, {n:,} parameters" for k, (t, n) in counts.items())


def lr_factor(step: int, total_steps: int, cfg: SchedulerConfig) -> float:
    """Multiplier on each group's base LR: linear warm-up, then constant or cosine to min_lr_ratio."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.type == "constant":
        return 1.0
    decay_steps = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: SchedulerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg))
