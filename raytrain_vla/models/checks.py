"""What the driver checks of a run's model options before Ray starts, through the contract only.

The family's own option checks, LoRA only where the family supports it, and the parameter roles
that LR groups and freezing name: they exist in the family and leave something to train.
"""

from __future__ import annotations

from collections.abc import Iterable

from raytrain_vla.config import ConfigError
from raytrain_vla.config.schema import ModelConfig, OptimizerConfig
from raytrain_vla.models.base import ACTION_EXPERT
from raytrain_vla.models.registry import get_family


def frozen_roles(cfg: OptimizerConfig, roles: Iterable[str]) -> list[str]:
    """`freeze_roles`, plus every role but the action expert's under `train_action_expert_only`."""
    frozen = list(cfg.freeze_roles)
    if cfg.train_action_expert_only:
        frozen += [r for r in roles if r != ACTION_EXPERT]
    return list(dict.fromkeys(frozen))


def check_roles(cfg: OptimizerConfig, roles: tuple[str, ...], model_type: str) -> None:
    """Every role that groups and freezing name exists in the model family (before Ray starts)."""
    named = [("optimizer.freeze_roles", r) for r in cfg.freeze_roles]
    named += [(f"optimizer.groups.{g.name}.roles", r) for g in cfg.groups for r in g.roles]
    for key, role in named:
        if role not in roles:
            raise ValueError(
                f"bad value for '{key}': {role!r} is not a parameter role of model type "
                f"{model_type!r}; its roles are {roles}"
            )
    if cfg.train_action_expert_only and ACTION_EXPERT not in roles:
        raise ValueError(
            f"'optimizer.train_action_expert_only': model type {model_type!r} has no "
            f"'{ACTION_EXPERT}' role (its roles are {roles}); name roles in optimizer.freeze_roles"
        )
    if set(frozen_roles(cfg, roles)) >= set(roles):
        raise ValueError(
            f"'optimizer.freeze_roles' {cfg.freeze_roles} with train_action_expert_only="
            f"{cfg.train_action_expert_only} freezes every role of {model_type!r} {roles}: "
            "nothing would train"
        )


def check_model_options(model: ModelConfig, optimizer: OptimizerConfig) -> None:
    """On the driver, before Ray starts: the family's options, LoRA and the roles named."""
    family = get_family(model.type)
    if model.lora.r and not family.supports_lora:
        raise ConfigError(f"'model.lora.r': model type {family.name!r} has no LoRA support")
    try:
        family.check_options(model.options, model.init_from, model.lora)
        check_roles(optimizer, family.roles, family.name)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from err
