"""Model FLOPs per training sample and the accelerator's peak, for MFU.

The count is analytic: torch's FlopCounterMode adds up matmul, convolution and attention FLOPs
from operand shapes over one forward and backward. It runs once, on the unsharded model, on a
batch of the dataset's real instructions (the text length sets the sequence length).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.base import VLAModel

# Dense bf16 peak per device (TFLOP/s), matched on the CUDA device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
MAX_EXAMPLE_TASKS = 16


def example_columns(spec: DataSpec, tasks: list[str]) -> dict[str, np.ndarray]:
    """One sample per instruction (up to 16) in the dataset's own column layout: black frames
    at each camera's resolution, zero state and actions. A processor makes the model batch."""
    n = min(len(tasks), MAX_EXAMPLE_TASKS)
    cols = {
        f"image/{k}": np.zeros((n, *shape), np.uint8) for k, shape in spec.camera_shapes.items()
    }
    cols["sample_id"] = np.arange(n, dtype=np.int64)
    cols["state"] = np.zeros((n, spec.state_dim), np.float32)
    cols["actions"] = np.zeros((n, spec.chunk_size, spec.action_dim), np.float32)
    cols["action_is_pad"] = np.zeros((n, spec.chunk_size), bool)
    cols["task"] = np.array(tasks[:n], dtype=object)
    return cols


def training_flops_per_sample(model: VLAModel, batch: dict) -> float:
    """Forward + backward FLOPs of one sample; leaves no gradients and no RNG trace behind."""
    n = len(batch["sample_ids"])
    device = batch["actions"].device
    noise = torch.zeros((n, *model.noise_shape), device=device)
    time = torch.full((n,), 0.5, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        counter = FlopCounterMode(display=False)
        with counter:
            model.compute_loss(batch, noise, time).sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / n


def peak_tflops(device: torch.device, precision: str, override: float = 0.0) -> float:
    """The device's dense peak for this precision, or 0 when unknown (then no MFU is logged)."""
    if override > 0:
        return override
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
    # TF32 tensor cores give about half the bf16 rate; plain fp32 is not worth quoting MFU for.
    return peak if precision == "bf16" else peak / 2
