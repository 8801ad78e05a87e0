"""Muon's Newton-Schulz orthogonalisation of matrices that FSDP2 shards by rows.

Newton-Schulz needs the whole matrix, and under FSDP2 a rank holds only a row shard, so running
`torch.optim.Muon` on the shards computes a different optimizer. Here each sharded matrix's
update is gathered whole on one owner rank of its shard group (owners round-robin, so the work
divides by the group's size), orthogonalised there by torch's own `_zeropower_via_newtonschulz`,
and scattered back as the same row shards. No rank gathers every matrix, and the exchange is two
all-to-alls per step (rows to the owners, results back), not a collective per matrix. Under
HSDP each replica group does the same on its own shards (their updates are equal after the
all-reduce).

The update is cast to the iteration's dtype before it travels: bf16 by default, where Newton-Schulz
starts with that cast, so the bits are those torch's single-process Muon computes, at half the
bytes. `optimizer.muon.ns_dtype=float32` runs the same iteration in fp32 instead: on a CPU
without bf16 matrix units it is 10-26x faster (a 128 x 512 matrix: 102 ms against 3.9 ms on one
thread here), and fp32 and bf16 results differ by about 4e-3 of the orthogonalised matrix's
entries. gloo moves every dtype as bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class NewtonSchulz:
    """torch.optim.Muon's defaults: 5 quintic steps with Keller Jordan's coefficients, in bf16
    (`dtype=torch.float32`: the same iteration in fp32)."""

    coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315)
    steps: int = 5
    eps: float = 1e-7
    dtype: torch.dtype = torch.bfloat16

    def __call__(self, matrix: Tensor) -> Tensor:
        """The orthogonalised matrix in `dtype`; in bf16 torch.optim.Muon's bits."""
        return newton_schulz(matrix, self.coefficients, self.steps, self.eps, self.dtype)


def newton_schulz(
    matrix: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
    dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """torch.optim.Muon's quintic iteration (`_zeropower_via_newtonschulz`) in `dtype`, op for
    op, so that one implementation serves both dtypes: in bf16 its bits are torch's
    (tests/unit/test_muon.py holds it to that, and test_muon_fsdp to torch's optimizer)."""
    a, b, c = coefficients
    tall = matrix.size(0) > matrix.size(1)
    x = matrix.to(dtype)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1; never in place on the caller's
    for _ in range(steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    return x.T if tall else x


def _row_shard_group(param: Tensor) -> dist.ProcessGroup | None:
    """The process group a DTensor's rows are sharded over; None for a whole tensor."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return None
    dims = [i for i, p in enumerate(param.placements) if isinstance(p, Shard)]
    if not dims:
        return None  # replicated on every rank: each holds the whole matrix
    if len(dims) != 1 or param.placements[dims[0]].dim != 0:
        raise ValueError(f"Muon needs row shards (Shard(0)); got {param.placements}")
    return param.device_mesh.get_group(dims[0])


def _as_wire(t: Tensor) -> Tensor:
    return t.view(torch.uint8)


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
        group = _row_shard_group(param)
        if group is None or dist.get_world_size(group) == 1:
            out[i] = ns(updates[i])
            continue
        key = id(group)
        groups[key] = group
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
    """Two all-to-alls per step and shard group, whatever the number of matrices: every rank
    sends each owner its (padded) rows of the owner's matrices, the owners orthogonalise them
    whole, and send every rank its rows back. Returns the bytes this rank sent and received."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    owner = {i: k % world for k, i in enumerate(indices)}
    rows = {i: math.ceil(params[i].shape[0] / world) for i in indices}
    size = {i: rows[i] * params[i].shape[1] for i in indices}  # one padded shard, in elements
    owned_by = [[i for i in indices if owner[i] == k] for k in range(world)]
    device = updates[indices[0]].device

    send = torch.zeros(sum(size.values()), dtype=ns.dtype, device=device)
    at = 0
    for k in range(world):  # to owner k: my rows of its matrices, in order
        for i in owned_by[k]:
            shard = send[at : at + size[i]].view(rows[i], -1)
            shard[: len(updates[i])] = updates[i]  # the cast Newton-Schulz starts with
            at += size[i]
    mine = sum(size[i] for i in owned_by[me])
    received = _all_to_all(send, [sum(size[i] for i in owned_by[k]) for k in range(world)],
                           [mine] * world, group)  # fmt: skip

    back = torch.empty(mine * world, dtype=ns.dtype, device=device)
    offset = 0
    for i in owned_by[me]:  # whole matrix = every rank's rows, in rank order
        pieces = [received[s * mine + offset : s * mine + offset + size[i]] for s in range(world)]
        whole = torch.cat(pieces).view(rows[i] * world, -1)[: params[i].shape[0]]
        ortho = ns(whole)
        padded = torch.zeros(rows[i] * world, ortho.shape[1], dtype=ortho.dtype, device=device)
        padded[: len(ortho)] = ortho
        for s in range(world):
            back[s * mine + offset : s * mine + offset + size[i]] = padded[
                s * rows[i] : (s + 1) * rows[i]
            ].reshape(-1)
        offset += size[i]
    mine_back = _all_to_all(back, [mine] * world,
                            [sum(size[i] for i in owned_by[k]) for k in range(world)], group)  # fmt: skip
    at = 0
    for k in range(world):
        for i in owned_by[k]:
            out[i] = mine_back[at : at + size[i]].view(rows[i], -1)[: len(updates[i])]
            at += size[i]
    to_others = (send.numel() - mine) + (received.numel() - mine)  # elements, each way
    return 2 * send.element_size() * to_others  # bytes, both exchanges


def _all_to_all(
    send: Tensor, send_sizes: list[int], recv_sizes: list[int], group: dist.ProcessGroup
) -> Tensor:
    """`all_to_all_single` with uneven splits; every dtype travels as bytes (gloo has no bf16)."""
    recv = torch.empty(sum(recv_sizes), dtype=send.dtype, device=send.device)
    width = send.element_size()
    dist.all_to_all_single(
        _as_wire(recv), _as_wire(send), [width * n for n in recv_sizes],
        [width * n for n in send_sizes], group=group,
    )  # fmt: skip
    return recv
