"""This rank's part of a tensor FSDP2 may have sharded: the one helper every module that
touches shards (step, optimizers, checkpoint staging) uses, so none of them imports another."""

from __future__ import annotations

import torch


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2's parameters and gradients); a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t
