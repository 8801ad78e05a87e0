"""Build the policy on the meta device, shard it, then fill the shards from rank 0's weights;
and the way back, every rank's shards gathered into full weights on rank 0.

Only rank 0 ever holds the full model (the init source: seeded init plus `model.init_from`); the
other ranks allocate just their shards and receive the values by broadcast, one tensor at a time.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from raytrain_vla.models.base import ModelFamily, VLAModel


def meta_model(family: ModelFamily, config) -> VLAModel:
    """The model's structure with no storage: sharding plans and LR groups need only names."""
    with torch.device("meta"):
        return family.build(config)


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


def gather_full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full weights on rank 0, in CPU memory; other ranks get an empty dict."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
