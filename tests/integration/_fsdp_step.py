"""One training step of a family's model on rows of an encoded batch, its gradients gathered
whole: what the FSDP tests compare between sharded ranks and one process."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def one_step(model, processor, encoded, noise, time, rows) -> tuple[torch.Tensor, dict]:
    batch = processor.collate({k: v[rows] for k, v in encoded.items()}, "cpu")
    loss = model(batch, noise[rows], time[rows]).mean()
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        if param.grad is not None:
            grad = param.grad
            grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad.clone()
    return loss.detach(), grads


def sharded_copy(family: str, model, rank: int, world: int, precision: str, checkpointing: bool):
    """`model` rebuilt on meta, frozen as training freezes it, sharded over `world` gloo ranks
    by `apply_fsdp` and filled from rank 0's full state."""
    from torch.distributed.device_mesh import init_device_mesh

    from raytrain_vla.config.schema import OptimizerConfig, TrainConfig
    from raytrain_vla.models.registry import get_family
    from raytrain_vla.train.fsdp import apply_fsdp
    from raytrain_vla.train.materialize import materialize_from_rank0, meta_model
    from raytrain_vla.train.optim import freeze_for_config

    copy = meta_model(get_family(family), model.config)
    freeze_for_config(copy, OptimizerConfig())
    cfg = TrainConfig(precision=precision, activation_checkpointing=checkpointing)
    apply_fsdp(copy, init_device_mesh("cpu", (world,)), cfg)
    materialize_from_rank0(copy, model.state_dict() if rank == 0 else None, torch.device("cpu"))
    return copy
