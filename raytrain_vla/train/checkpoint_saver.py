"""Checkpoints saved in the foreground or in the background, at most one in flight.

In the background (`train.async_checkpoint`) a save costs the step loop at most the copy of this
rank's shards into shared host memory (buffers kept from one save to the next). The copy runs in
a thread while the next forward and backward only read the weights; the optimizer's next step,
which writes them, waits for it first (a step pre-hook on the optimizer given here), as
torchtitan's zero-overhead checkpointing does. DCP's checkpoint process (`async_save` with
`AsyncCheckpointerType.PROCESS`, one per rank, started at the first save) then writes them at
the lowest CPU priority, through `train.write_behind` (pages dropped as written, CRC32s computed
on the way). A process, not a thread: DCP's serialisation holds the GIL, and a writer thread
slowed the step loop more than a synchronous save took (benchmarks/README.md). A thread of this
process then waits for the write and writes the manifest, over a gloo group of its own
(collectives in two threads must not share a group). The checkpoint is reported to Ray Train
(`on_complete`) only when every rank's write and the manifest are done: each step, one
all-reduce of a done flag lets the ranks agree on when. Until then the previous checkpoint is
the latest one, so a worker killed mid-write resumes from it. A new save, the end of the run
and `finish` wait for the one in flight.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from raytrain_vla.errors import RunCannotContinue
from raytrain_vla.train.checkpoint import write_tensors
from raytrain_vla.train.manifest import write_manifest
from raytrain_vla.train.shards import local_shard
from raytrain_vla.train.write_behind import WriteBehindWriter

OnComplete = Callable[[], None]
SHARED_MEMORY = Path("/dev/shm")  # where torch's shared-memory tensors live on Linux
_GB = 1e9


def staging_bytes(model: nn.Module, frozen: Collection[str]) -> int:
    """What one background save stages for this rank: its shards of the trained weights and of
    AdamW's two moments (kept in the weights' dtype)."""
    local = 0
    for name, param in model.named_parameters():
        if name not in frozen:
            shard = local_shard(param)
            local += shard.numel() * shard.element_size()
    return 3 * local


def check_staging_room(per_rank: int, local_ranks: int, shared: Path = SHARED_MEMORY) -> None:
    """Refuse, before the first step, a background save that this node's shared memory cannot
    hold: a container's default /dev/shm (64 MB) would otherwise fail at the first save, maybe
    hours in. Every rank checks its own node."""
    if not shared.is_dir():  # not Linux: torch shares memory another way
        return
    free = shutil.disk_usage(shared).free
    needed = per_rank * local_ranks
    if needed > free:
        raise RunCannotContinue(
            f"train.async_checkpoint stages each rank's checkpoint shards in {shared}: this "
            f"node's {local_ranks} rank(s) need {needed / _GB:.2f} GB and {shared} has "
            f"{free / _GB:.2f} GB free; give the node or container more shared memory (docker "
            "--shm-size) or set train.async_checkpoint=false"
        )


@dataclass
class _InFlight:
    future: Future
    staged: Future | None  # the copy into host memory (None once waited for)
    on_complete: OnComplete


class CheckpointSaver:
    """`save(directory, state, rank, on_complete)` writes `state` (DCP's tensor state dict) into
    `directory`, whose sidecar files the caller has written, then calls `on_complete`."""

    def __init__(
        self,
        background: bool,
        device: torch.device,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        """`optimizer`: the one whose state is saved; in the background its steps wait for the
        staging copy (without it, `save` waits for the copy itself)."""
        self.background = background
        self.device = device
        self.distributed = dist.is_available() and dist.is_initialized()
        self.in_flight: _InFlight | None = None
        self.group = None
        if background:
            if self.distributed:  # collective: every rank creates it, in the same order
                self.group = dist.new_group(backend="gloo")
            # Shared memory, so the checkpoint process reads the staged shards without a copy.
            pinned = device.type == "cuda"
            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=pinned, use_shared_memory=True,
                    use_async_staging=True, use_non_blocking_copy=False,
                )
            )  # fmt: skip
            self.staging_guarded = optimizer is not None
            if optimizer is not None:
                optimizer.register_step_pre_hook(lambda *_: self.wait_staged())
            self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")

    def save(self, directory: Path, state: dict, rank: int, on_complete: OnComplete) -> None:
        """Collective."""
        self.finish()  # at most one in flight
        if not self.background:
            write_tensors(directory, state, rank)
            on_complete()
            return
        # Staging is the only part the step loop waits for.
        response = dcp.async_save(
            state, storage_writer=WriteBehindWriter(directory, background=True), process_group=self.group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS, async_stager=self.stager,
        )  # fmt: skip
        written = response.upload_completion
        future = self.writer.submit(self._complete, written, directory, rank)
        self.in_flight = _InFlight(future, response.staging_completion, on_complete)
        if not self.staging_guarded:
            self.wait_staged()

    def wait_staged(self) -> None:
        """Return once the save in flight (if any) has copied the state it saves."""
        if self.in_flight is not None and self.in_flight.staged is not None:
            self.in_flight.staged.result()
            self.in_flight.staged = None

    def _complete(self, written: Future, directory: Path, rank: int) -> None:
        written.result()
        write_manifest(directory, rank, self.group)  # last: the checkpoint is complete

    def poll(self) -> None:
        """Collective while a save is in flight: complete it once every rank's write is done."""
        if self.in_flight is None:
            return
        done = torch.tensor([float(self.in_flight.future.done())], device=self._flag_device())
        if self.distributed:
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            self.finish()

    def finish(self) -> None:
        """Wait for the save in flight (if any), raise its error, and report it."""
        if self.in_flight is None:
            return
        self.wait_staged()
        in_flight, self.in_flight = self.in_flight, None
        in_flight.future.result()
        in_flight.on_complete()

    def close(self) -> None:
        """Complete what is in flight, then release the writer thread and staging buffers."""
        self.finish()
        if self.background:
            self.writer.shutdown(wait=True)
            self.stager.close()

    def _flag_device(self) -> torch.device:
        if self.distributed and dist.get_backend() == "nccl":
            return self.device
        return torch.device("cpu")
