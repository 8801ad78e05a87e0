"""Where frozen parameters live: replicated on every rank in the compute dtype (never gathered,
never reduced), or sharded like the trained ones. One rule, used by the trainer and by
`plan-memory`, so the plan says what a run will do.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Literal

import torch
from torch import nn

from raytrain_vla.config.schema import FrozenParams, Precision

Placement = Literal["replicate", "shard"]

# `auto` replicates frozen weights when a full copy takes at most this share of a rank's memory:
# what is left holds the sharded trained state, activations and the gathered units.
REPLICATE_SHARE = 0.25


def compute_dtype(precision: Precision) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def frozen_bytes(model: nn.Module, frozen: Collection[str], precision: Precision) -> int:
    """Bytes of one full copy of the frozen floating-point parameters in the compute dtype
    (works on a meta-device model)."""
    names = set(frozen)
    size = torch.tensor([], dtype=compute_dtype(precision)).element_size()
    return sum(
        p.numel() * (size if p.is_floating_point() else p.element_size())
        for n, p in model.named_parameters()
        if n in names
    )


def rank_memory_bytes(device: torch.device, local_world_size: int = 1) -> int:
    """A rank's memory: its GPU's, or on CPU the host's RAM split between its local ranks."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // max(1, local_world_size)


def place_frozen(mode: FrozenParams, frozen_nbytes: int, rank_nbytes: int) -> Placement:
    """`train.frozen_params` resolved: `auto` replicates when the copy fits its share."""
    if mode != "auto":
        return mode
    return "replicate" if frozen_nbytes <= REPLICATE_SHARE * rank_nbytes else "shard"
