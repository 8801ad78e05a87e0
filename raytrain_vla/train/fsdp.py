"""FSDP2 applied from outside the model: one unit per transformer block, the vision tower, the root.

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


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg: TrainConfig) -> nn.Module:
    """Shard `model` in place. It must expose `transformer_blocks()` and a `vision` tower."""
    blocks = list(model.transformer_blocks())
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(blocks)
    kwargs = {
        "mesh": mesh,
        "mp_policy": mixed_precision(cfg.precision),
        "offload_policy": CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy(),
    }
    for block in blocks:
        fully_shard(block, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    fully_shard(model.vision, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    # The root's parameters are needed right away in backward, so keep them unsharded after forward.
    # Its inputs are not cast: the model keeps flow time, noise and actions in fp32 and casts
    # what its layers consume (FlowVLA.forward).
    kwargs["mp_policy"] = mixed_precision(cfg.precision, cast_inputs=False)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model
