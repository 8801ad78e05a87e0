"""Run a per-rank program on N gloo processes without Ray, and return rank 0's result."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain_vla.train.rank_exit import exit_rank

RankProgram = Callable[[int, int], dict]  # (rank, world) -> result; module level, so it pickles


def _entry(rank: int, world: int, store: str, program: RankProgram, out: str) -> None:
    # A file store, not a TCP port picked in advance: a port found free here can be taken by
    # another process (a Ray worker starting) before rank 0 binds it, which killed a rank in CI.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    result = program(rank, world)  # an exception exits non-zero; peers fail or time out
    if rank == 0:
        torch.save(result, out)
    del result  # its tensors may hold the program's meshes alive
    exit_rank()


def run_distributed(program: RankProgram, tmp_path, world: int = 2) -> dict:
    """Spawned processes import the program's module again, as a rank of a real run would."""
    name = getattr(program, "__name__", None) or program.func.__name__
    out = str(tmp_path / f"{name}.pt")
    store = str(tmp_path / f"{name}.{uuid.uuid4().hex[:8]}.store")  # must not exist yet
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(r, world, store, program, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, f"{name}: ranks hung (a collective deadlocked)"
    assert all(p.exitcode == 0 for p in procs), f"{name}: a rank failed"
    return torch.load(out, weights_only=True)
