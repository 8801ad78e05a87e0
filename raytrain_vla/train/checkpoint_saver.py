"""Checkpoints saved in the foreground or in the background, at most one in flight.

In the background (`train.async_checkpoint`) a save costs the step loop only the copy of this
rank's shards into host memory (pinned on a GPU); a writer thread then runs DCP and the manifest
over a gloo group of its own (collectives in two threads must not share a group), as torchtitan's
asynchronous checkpointing does. The checkpoint is reported to Ray Train (`on_complete`) only when
every rank's write and the manifest are done: each step, one all-reduce of a done flag lets the
ranks agree on when. Until then the previous checkpoint is the latest one, so a worker killed
mid-write resumes from it. A new save, the end of the run and `finish` wait for the one in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from raytrain_vla.train.checkpoint import write_tensors

OnComplete = Callable[[], None]


@dataclass
class _InFlight:
    future: Future
    on_complete: OnComplete


class CheckpointSaver:
    """`save(directory, state, rank, on_complete)` writes `state` (DCP's tensor state dict) into
    `directory`, whose sidecar files the caller has written, then calls `on_complete`."""

    def __init__(self, background: bool, device: torch.device) -> None:
        self.background = background
        self.device = device
        self.distributed = dist.is_available() and dist.is_initialized()
        self.in_flight: _InFlight | None = None
        self.group = None
        if background:
            if self.distributed:  # collective: every rank creates it, in the same order
                self.group = dist.new_group(backend="gloo")
            pinned = device.type == "cuda"
            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=pinned, use_shared_memory=False,
                    use_async_staging=False, use_non_blocking_copy=False,
                )
            )  # fmt: skip
            self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")

    def save(self, directory: Path, state: dict, rank: int, on_complete: OnComplete) -> None:
        """Collective."""
        self.finish()  # at most one in flight
        if not self.background:
            write_tensors(directory, state, rank)
            on_complete()
            return
        staged = self.stager.stage(state)  # the only part the step loop waits for
        future = self.writer.submit(write_tensors, directory, staged, rank, self.group)
        self.in_flight = _InFlight(future, on_complete)

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
