"""Validation on held-out episodes: flow loss and action error in the robot's original units.

Noise is keyed to (seed, sample id) through a dedicated stream, so validation never touches the
training RNG, and every rank runs the same number of forwards (FSDP collectives stay matched).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from raytrain_vla.models.base import InputProcessor, VLAModel
from raytrain_vla.train.noise import VAL_STREAM, flow_noise_and_time


def pad_to_ranks(
    ids: np.ndarray, world_size: int, micro_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pad the id list so every rank gets the same number of full batches; pads weigh zero."""
    unit = world_size * micro_batch
    total = max(unit, -(-len(ids) // unit) * unit)
    reps = np.resize(ids, total)
    weight = np.zeros(total, dtype=np.float32)
    weight[: len(ids)] = 1.0
    return reps, weight


@torch.no_grad()
def validate(
    model: VLAModel,
    batches: list[tuple[dict, torch.Tensor]],
    processor: InputProcessor,
    mean_action: np.ndarray,
    seed: int,
) -> dict[str, float]:
    """`batches` are (model batch, per-sample weight); returns metrics reduced over all ranks.

    Errors are measured in the robot's units, as the processor turns model actions back."""
    device = batches[0][0]["actions"].device
    action_dim = processor.action_dim
    acc = torch.zeros(3 + 3 * action_dim, dtype=torch.float64, device=device)
    for batch, weight in batches:
        ids = batch["sample_ids"].tolist()
        noise, time = flow_noise_and_time(seed, VAL_STREAM, ids, model.noise_shape)
        loss = model.compute_loss(batch, noise.to(device), time.to(device))
        pred = processor.decode_actions(model.sample_actions(batch, noise.to(device)))
        true = processor.decode_actions(batch["actions"])
        valid = (~batch["action_is_pad"]).float() * weight[:, None].to(device)  # (B, chunk)
        err = pred - true
        base = torch.as_tensor(mean_action, device=device, dtype=true.dtype) - true
        acc[0] += (loss.double() * weight.to(device)).sum()
        acc[1] += weight.sum()
        acc[2] += valid.sum()
        v = valid[..., None].double()
        acc[3 : 3 + action_dim] += (err.double().square() * v).sum((0, 1))
        acc[3 + action_dim : 3 + 2 * action_dim] += (err.double().abs() * v).sum((0, 1))
        acc[3 + 2 * action_dim :] += (base.double().square() * v).sum((0, 1))
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(acc)
    n_valid = float(acc[2])
    mse_dim = acc[3 : 3 + action_dim] / n_valid
    l1_dim = acc[3 + action_dim : 3 + 2 * action_dim] / n_valid
    base_dim = acc[3 + 2 * action_dim :] / n_valid
    out = {
        "val_loss": float(acc[0] / acc[1]),
        "val_action_mse": float(mse_dim.mean()),
        "val_action_l1": float(l1_dim.mean()),
        "val_mean_action_mse": float(base_dim.mean()),
        "val_samples": float(acc[1]),
    }
    out["val_mse_ratio"] = out["val_action_mse"] / max(out["val_mean_action_mse"], 1e-12)
    for d in range(action_dim):
        out[f"val_action_mse/{d}"] = float(mse_dim[d])
        out[f"val_action_l1/{d}"] = float(l1_dim[d])
    return out
