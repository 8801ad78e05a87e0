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
