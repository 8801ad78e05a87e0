"""FSDP2 applied from outside the model: the units the model declares (`fsdp_units`), then the root.

Activation checkpointing wraps each block's forward in place so parameter names (and therefore
LR groups and checkpoints) stay the same with and without it.

Frozen parameters can stay out of FSDP (`ignored_params`): each rank then holds them whole, in
the compute dtype, and no step gathers or reduces them (`train.frozen_params`, `train/frozen.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.utils.checkpoint import checkpoint

from raytrain_vla.config.schema import TrainConfig
from raytrain_vla.models.base import VLAModel
from raytrain_vla.train.comm import CommCounter
from raytrain_vla.train.frozen import compute_dtype


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


def apply_fsdp(
    model: VLAModel,
    mesh: DeviceMesh,
    cfg: TrainConfig,
    replicated: Collection[str] = (),
    comm: CommCounter | None = None,
) -> VLAModel:
    """Shard `model` in place: each of its `fsdp_units()`, then the root.

    `replicated` names frozen parameters FSDP leaves alone: they are cast to the compute dtype
    here (still on the meta device, so they are allocated at that size) and every rank keeps
    them whole. `comm`, when given, counts the bytes of every all-gather and reduce-scatter;
    either way the units get its collectives (on gloo, the faster reduce-scatter).
    """
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model.activation_checkpoint_units())
    ignored = _replicate(model, replicated, compute_dtype(cfg.precision))
    kwargs = {
        "mesh": mesh,
        "mp_policy": mixed_precision(cfg.precision),
        "offload_policy": CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy(),
        "ignored_params": ignored or None,
    }
    units = model.fsdp_units()
    for unit in units:
        fully_shard(unit, reshard_after_forward=cfg.reshard_after_forward, **kwargs)
    # The root's parameters are needed right away in backward, so keep them unsharded after forward.
    # Its inputs are not cast: a model keeps flow time, noise and actions in fp32 and casts what
    # its layers consume (the family contract, models/base.py).
    kwargs["mp_policy"] = mixed_precision(cfg.precision, cast_inputs=False)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    comm = comm if comm is not None else CommCounter()
    comm.attach([m for m in [*units, model] if isinstance(m, FSDPModule)], mesh)
    return model


def _replicate(model: nn.Module, names: Collection[str], dtype: torch.dtype) -> set[nn.Parameter]:
    """The parameters `names` in the compute dtype, as the set `fully_shard` ignores."""
    wanted = set(names)
    params = set()
    for name, param in model.named_parameters():
        if name not in wanted:
            continue
        if param.requires_grad:
            raise ValueError(f"{name}: only frozen parameters can be replicated outside FSDP")
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
        params.add(param)
    return params
