"""Build the policy on the meta device, shard it, then fill the shards from rank 0's weights.

Only rank 0 ever holds the full model (the init source: seeded init plus `model.init_from`); the
other ranks allocate just their shards and receive the values by broadcast, one tensor at a time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from raytrain_vla.models.registry import build_model


def meta_model(model_type: str, kwargs: dict) -> nn.Module:
    """The model's structure with no storage: sharding plans and LR groups need only names."""
    with torch.device("meta"):
        return build_model(model_type, kwargs)


def materialize_from_rank0(
    model: nn.Module, full_state: dict[str, torch.Tensor] | None, device: torch.device
) -> None:
    """Collective. `model` is sharded and on meta; rank 0 passes the full state, others None."""
    persistent = set(model.state_dict())
    transient = [name for name, _ in model.named_buffers() if name not in persistent]
    if transient:  # to_empty leaves them uninitialised and no state dict would fill them
        raise ValueError(f"non-persistent buffers {transient[:4]} cannot be materialised")
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state or {}, options=options)
