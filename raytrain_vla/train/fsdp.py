"""FSDP2 applied from outside the model: the units the model declares (`fsdp_units`), then the root.

Activation checkpointing wraps each block's forward in place so parameter names (and therefore
LR groups and checkpoints) stay the same with and without it.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.utils.checkpoint import checkpoint

from raytrain_vla.config.schema import TrainConfig
from raytrain_vla.models.base import VLAModel


def mixed_precision(precision: str, cast_inputs: bool = True) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction, or plain fp32."""
    if precision == "bf16":
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast_inputs
        )
    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)


def apply_activation_checkpointing(blocks: list[nn.Module]) -> None:
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def apply_fsdp(model: VLAModel, mesh: DeviceMesh, cfg: TrainConfig) -> VLAModel:
    """Shard `model` in place: each of its `fsdp_units()`, then the root."""
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model.activation_checkpoint_units())
    kwargs = {
        "mesh": mesh,
        "mp_policy": mixed_precision(cfg.precision),
        "offload_policy": CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy(),
    }
    for unit in model.fsdp_units():
        fully_shard(unit, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    # The root's parameters are needed right away in backward, so keep them unsharded after forward.
    # Its inputs are not cast: a model keeps flow time, noise and actions in fp32 and casts what
    # its layers consume (the family contract, models/base.py).
    kwargs["mp_policy"] = mixed_precision(cfg.precision, cast_inputs=False)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model
