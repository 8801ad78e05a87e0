"""Bytes FSDP2 moves per step, counted where it moves them: the all-gather and reduce-scatter
objects of every FSDP unit (`set_custom_all_gather` / `set_custom_reduce_scatter`) are replaced
by torch's defaults plus a byte count: the gathered (full) size of each all-gather, the full
gradient size of each reduce-scatter. Under HSDP each reduce-scatter's output (this rank's shard)
is then all-reduced across the replicas; that payload is counted as `comm/allreduce_bytes`.

On gloo (CPU) the same reduce-scatter object carries each reduce-scatter as an all-reduce of
the flat gradient buffer in place followed by a copy of this rank's chunk: gloo's own
reduce-scatter is 2-3x slower than its all-reduce of the same buffer
(`benchmarks/README.md`, "Frozen weights"), and the sums are bitwise the same as its
reduce-scatter's (`test_fsdp_numerics`). The counted payload stays the reduce-scatter's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

try:  # torch's default comms; private, so a torch without them reports no comm metrics
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )
except ImportError:  # pragma: no cover - other torch layouts
    DefaultAllGather = DefaultReduceScatter = None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def reduce_scatter_by_all_reduce(
    output: torch.Tensor, flat_input: torch.Tensor, group: dist.ProcessGroup, op: dist.ReduceOp
) -> None:
    """FSDP2's reduce-scatter of a flat buffer (rank r's output is chunk r), done as gloo does
    fastest: all-reduce the buffer in place (FSDP does not read it again), copy our chunk."""
    dist.all_reduce(flat_input, op=op, group=group)
    output.copy_(flat_input.view(group.size(), -1)[group.rank()])


class CommCounter:
    """Running totals of this rank's collective payloads; `take()` returns and resets them."""

    def __init__(self) -> None:
        self.allgather_bytes = 0
        self.reduce_scatter_bytes = 0
        self.allreduce_bytes = 0
        self.available = False

    def attach(self, modules: Iterable[FSDPModule], mesh: DeviceMesh) -> None:
        if DefaultAllGather is None or not hasattr(FSDPModule, "set_custom_all_gather"):
            return
        hsdp = mesh.ndim == 2 and mesh.size(0) > 1
        counter = self

        class CountingAllGather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                counter.allgather_bytes += _nbytes(output_tensor)
                return super().__call__(output_tensor, input_tensor, group, async_op)

        class CountingReduceScatter(DefaultReduceScatter):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                counter.reduce_scatter_bytes += _nbytes(input_tensor)
                if async_op or dist.get_backend(group) != "gloo":
                    return super().__call__(output_tensor, input_tensor, group, op, async_op)
                return reduce_scatter_by_all_reduce(output_tensor, input_tensor, group, op)

        def count_all_reduce(output: torch.Tensor) -> None:
            # Runs after HSDP's all-reduce of each reduced shard (also where a shard group of
            # one skips the reduce-scatter); on a flat mesh it would follow the reduce-scatter.
            counter.allreduce_bytes += _nbytes(output)

        for module in modules:
            module.set_custom_all_gather(CountingAllGather())
            module.set_custom_reduce_scatter(CountingReduceScatter())
            if hsdp:
                module.set_all_reduce_hook(count_all_reduce)
        self.available = True

    def take(self) -> dict[str, float]:
        """`comm/*` metrics since the last call (nothing when the counts are unavailable)."""
        if not self.available:
            return {}
        out = {
            "comm/allgather_bytes": float(self.allgather_bytes),
            "comm/reduce_scatter_bytes": float(self.reduce_scatter_bytes),
        }
        if self.allreduce_bytes:
            out["comm/allreduce_bytes"] = float(self.allreduce_bytes)
        self.allgather_bytes = self.reduce_scatter_bytes = self.allreduce_bytes = 0
        return out
