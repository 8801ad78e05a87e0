"""Muon's Newton-Schulz orthogonalisation of matrices that FSDP2 shards by rows.

Newton-Schulz needs the whole matrix, and under FSDP2 a rank holds only a row shard, so running
`torch.optim.Muon` on the shards computes a different optimizer. Here each sharded matrix's
update is gathered whole on one owner rank of its shard group (owners round-robin, so the work
divides by the group's size), orthogonalised there by torch's own `_zeropower_via_newtonschulz`,
and scattered back as the same row shards. No rank gathers every matrix. Under HSDP each replica
group does the same on its own shards (their updates are equal after the all-reduce).

The update is cast to bf16 before it travels: Newton-Schulz starts with that cast, so the bits
are those torch's single-process Muon computes, at half the bytes. gloo moves bf16 as bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class NewtonSchulz:
    """torch.optim.Muon's defaults: 5 quintic steps with Keller Jordan's coefficients."""

    coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315)
    steps: int = 5
    eps: float = 1e-7

    def __call__(self, matrix: Tensor) -> Tensor:
        """The bf16 orthogonalised matrix, exactly as torch.optim.Muon computes it."""
        from torch.optim._muon import _zeropower_via_newtonschulz

        return _zeropower_via_newtonschulz(matrix, self.coefficients, self.steps, self.eps)


def _row_shard(param: Tensor) -> tuple[dist.ProcessGroup, int] | None:
    """(process group, mesh dim) of a DTensor sharded by rows; None for a whole tensor."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return None
    dims = [i for i, p in enumerate(param.placements) if isinstance(p, Shard)]
    if not dims:
        return None  # replicated on every rank: each holds the whole matrix
    if len(dims) != 1 or param.placements[dims[0]].dim != 0:
        raise ValueError(f"Muon needs row shards (Shard(0)); got {param.placements}")
    return param.device_mesh.get_group(dims[0]), dims[0]


def _as_wire(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t


def orthogonalize(
    updates: list[Tensor], params: list[Tensor], ns: NewtonSchulz
) -> tuple[list[Tensor], int]:
    """This rank's shard of NS(whole update) for each parameter, and the bytes it sent and
    received. `updates[i]` is this rank's local rows of parameter i's update (the whole matrix
    when `params[i]` is not sharded)."""
    out: list[Tensor | None] = [None] * len(params)
    by_group: dict[int, list[int]] = {}
    groups: dict[int, dist.ProcessGroup] = {}
    for i, param in enumerate(params):
        shard = _row_shard(param)
        if shard is None or dist.get_world_size(shard[0]) == 1:
            out[i] = ns(updates[i])
            continue
        key = id(shard[0])
        groups[key] = shard[0]
        by_group.setdefault(key, []).append(i)
    moved = 0
    for key, indices in by_group.items():
        moved += _orthogonalize_group(updates, params, indices, groups[key], ns, out)
    return [t for t in out if t is not None], moved


def _orthogonalize_group(
    updates: list[Tensor],
    params: list[Tensor],
    indices: list[int],
    group: dist.ProcessGroup,
    ns: NewtonSchulz,
    out: list[Tensor | None],
) -> int:
    """Gather every matrix on its owner, orthogonalise the owned ones, scatter them back."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    owner_of = {i: k % world for k, i in enumerate(indices)}
    shapes = {i: (math.ceil(params[i].shape[0] / world), params[i].shape[1]) for i in indices}
    moved = 0
    gathered: dict[int, list[Tensor]] = {}
    works = []
    for i in indices:  # every gather in flight at once: owners receive in parallel
        padded = torch.zeros(shapes[i], dtype=torch.bfloat16, device=updates[i].device)
        padded[: len(updates[i])] = updates[i]
        owner = owner_of[i]
        pieces = [torch.empty_like(padded) for _ in range(world)] if owner == me else None
        gathered[i] = pieces or []
        works.append(
            dist.gather(
                _as_wire(padded),
                [_as_wire(p) for p in pieces] if pieces else None,
                dst=dist.get_global_rank(group, owner),
                group=group,
                async_op=True,
            )
        )
        moved += padded.numel() * padded.element_size() * (world - 1 if owner == me else 1)
    for work in works:
        work.wait()
    works, received = [], {}
    for i in indices:
        owner = owner_of[i]
        pieces = None
        if owner == me:
            whole = torch.cat(gathered[i])[: params[i].shape[0]]
            ortho = ns(whole)
            rows = shapes[i][0]
            pieces = [
                torch.zeros(shapes[i], dtype=ortho.dtype, device=ortho.device) for _ in range(world)
            ]
            for k in range(world):
                part = ortho[k * rows : (k + 1) * rows]
                pieces[k][: len(part)] = part
        received[i] = torch.empty(shapes[i], dtype=torch.bfloat16, device=updates[i].device)
        works.append(
            dist.scatter(
                _as_wire(received[i]),
                [_as_wire(p) for p in pieces] if pieces else None,
                src=dist.get_global_rank(group, owner),
                group=group,
                async_op=True,
            )
        )
        size = received[i].numel() * received[i].element_size()
        moved += size * (world - 1 if owner == me else 1)
    for work in works:
        work.wait()
    for i in indices:
        out[i] = received[i][: len(updates[i])]
    return moved
