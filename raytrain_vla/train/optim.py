"""LR groups by regex, freezing, AdamW and the LR schedule.

Groups are resolved on parameter names before sharding, so a group means the same parameters on
every rank and at every world size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig

DEFAULT_GROUP = "default"
ACTION_EXPERT_PREFIX = "action_expert."


@dataclass
class ParamGroup:
    name: str
    param_names: list[str]
    lr: float
    weight_decay: float


def freeze_for_config(model: nn.Module, cfg: OptimizerConfig) -> list[str]:
    """Apply `train_action_expert_only`; returns the names of the frozen parameters."""
    frozen = []
    if cfg.train_action_expert_only:
        for name, param in model.named_parameters():
            if not name.startswith(ACTION_EXPERT_PREFIX):
                param.requires_grad_(False)
                frozen.append(name)
    return frozen


def resolve_groups(
    named_params: Iterable[tuple[str, nn.Parameter]], cfg: OptimizerConfig
) -> list[ParamGroup]:
    """First matching group wins; unclaimed trainable parameters go to the default group.

    A configured group that claims no trainable parameter is an error: it is almost always a typo.
    """
    compiled = [(g, [re.compile(p) for p in g.patterns]) for g in cfg.groups]
    groups = {g.name: ParamGroup(g.name, [], g.lr, g.weight_decay) for g in cfg.groups}
    default = ParamGroup(DEFAULT_GROUP, [], cfg.lr, cfg.weight_decay)
    for name, param in named_params:
        if not param.requires_grad:
            continue
        for group_cfg, patterns in compiled:
            if any(p.search(name) for p in patterns):
                groups[group_cfg.name].param_names.append(name)
                break
        else:
            default.param_names.append(name)
    empty = [g.name for g in groups.values() if not g.param_names]
    if empty and not cfg.train_action_expert_only:
        raise ValueError(
            f"optimizer.groups {empty} match no trainable parameter; check their 'patterns'"
        )
    out = [g for g in groups.values() if g.param_names]
    if default.param_names:
        out.append(default)
    return out


def build_optimizer(
    model: nn.Module, groups: list[ParamGroup], cfg: OptimizerConfig
) -> torch.optim.Optimizer:
    params = dict(model.named_parameters())
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
