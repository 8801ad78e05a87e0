"""Model FLOPs per training sample and the accelerator's peak, for MFU.

The count is analytic: torch's FlopCounterMode adds up matmul, convolution and attention FLOPs
from operand shapes over one forward and backward. It runs once, on the unsharded model, on a
batch of the dataset's real instructions (the text length sets the sequence length).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# Dense bf16 peak per device (TFLOP/s), matched on the CUDA device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
MAX_EXAMPLE_TASKS = 16


def example_batch(
    task_tokens: torch.Tensor,
    task_mask: torch.Tensor,
    camera_keys: list[str],
    image_size: list[int],
    state_dim: int,
    action_dim: int,
    chunk_size: int,
    device: torch.device,
) -> dict:
    """One sample per instruction (up to 16), shaped like `BatchTransform` output."""
    n = min(len(task_tokens), MAX_EXAMPLE_TASKS)
    h, w = image_size
    return {
        "sample_ids": torch.arange(n, device=device),
        "images": {k: torch.zeros(n, 3, h, w, device=device) for k in camera_keys},
        "state": torch.zeros(n, state_dim, device=device),
        "text_tokens": task_tokens[:n].to(device),
        "text_mask": task_mask[:n].to(device),
        "actions": torch.zeros(n, chunk_size, action_dim, device=device),
        "action_is_pad": torch.zeros(n, chunk_size, dtype=torch.bool, device=device),
    }


def training_flops_per_sample(model: nn.Module, batch: dict) -> float:
    """Forward + backward FLOPs of one sample; leaves no gradients and no RNG trace behind."""
    n = len(batch["sample_ids"])
    device = batch["state"].device
    noise = torch.zeros_like(batch["actions"])
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
