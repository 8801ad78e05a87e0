"""Per-rank Ray Data pipeline: plan slice -> read tasks -> decoded samples, in plan order.

Each rank turns its own work list (its contiguous slice of every global batch, from the cursor
on) into read tasks. Ray Data runs them on any node with CPUs, and `preserve_order` hands the
blocks back in task order, so the loop sees exactly the plan's order whatever the timing.
`streaming_split` is not used: its block assignment is not deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import ray


class SampleSource(Protocol):
    """Reads samples by id; picklable, so Ray Data tasks can carry it."""

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Columns for these samples, in this order; must include `sample_id`."""
        ...


def read_tasks(work: np.ndarray, samples_per_task: int, micro_batch: int) -> list[np.ndarray]:
    """Split a rank's work list into read tasks that end on micro-batch boundaries."""
    size = max(micro_batch, samples_per_task // micro_batch * micro_batch)
    return [work[i : i + size] for i in range(0, len(work), size)]


def _read_fn(source: SampleSource):
    def read(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in batch["ids"]])
        return source.read(ids)

    return read


def iter_rank_batches(
    source: SampleSource,
    work: np.ndarray,
    micro_batch: int,
    samples_per_task: int = 512,
    prefetch_batches: int = 4,
    num_cpus_per_task: float = 1.0,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield this rank's micro-batches (numpy columns) in plan order."""
    if len(work) == 0:
        return iter(())
    tasks = read_tasks(work, samples_per_task, micro_batch)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    # One stream per rank per run: per-dataset banners and progress bars would drown the log.
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ds = ray.data.from_items([{"ids": t} for t in tasks], override_num_blocks=len(tasks))
    ds = ds.map_batches(
        _read_fn(source), batch_size=1, num_cpus=num_cpus_per_task, zero_copy_batch=True
    )
    return iter(
        ds.iter_batches(
            batch_size=micro_batch,
            batch_format="numpy",
            prefetch_batches=prefetch_batches,
            drop_last=False,
        )
    )


class InMemorySource:
    """Already-decoded samples held in arrays: for benchmarks that measure framework overhead."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns
        self.row_of = {int(s): i for i, s in enumerate(columns["sample_id"])}

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        rows = np.array([self.row_of[int(s)] for s in sample_ids], dtype=np.int64)
        return {k: v[rows] for k, v in self.columns.items()}
