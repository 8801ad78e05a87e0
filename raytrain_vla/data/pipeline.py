"""Per-rank Ray Data pipeline: plan slice -> read tasks -> decoded samples, in plan order.

Each rank turns its own work (its contiguous slice of every global batch, from the cursor on,
computed step by step as the segments need it) into read tasks. A task carries its source's
`reader(ids)`: the file rows and video references of its own samples, never the dataset index. Ray Data runs them on any node with CPUs and returns blocks in task order
(`preserve_order`), so the loop sees exactly the plan's order whatever the timing.
`streaming_split` is not used: its block assignment is not deterministic.

A materialised segment is read block by block here, not through `Dataset.iter_batches`: in Ray
2.60 that leaves its prefetch thread alive, holding the blocks it last prefetched, whenever the
consumer stops before the end (the thread is stopped only at exhaustion). A loop that stops
early (a run's last step, a first-batch timing, a notebook) would keep each such segment in the
object store until it spills.

The work list is executed in bounded segments: segment i+1 is materialised by Ray Data in the
background while the loop consumes segment i. One long streaming execution would do the same
in theory, but Ray Data 2.60's scheduling loop busy-polls inside the consuming (training)
process whenever backpressure holds every task back, which starves training on small CPU
nodes. A segment never hits backpressure, so its executor waits on tasks instead of spinning.
"""

from __future__ import annotations

import logging
import pickle
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain, islice
from typing import Protocol

import numpy as np
import ray
from ray.data.block import BlockAccessor
from ray.util.debug import log_once

from raytrain_vla.data.read_tasks import cut_tasks


class SampleRead(Protocol):
    """One read task's samples; picklable and small, so Ray Data ships it to any node."""

    def read(self) -> dict[str, np.ndarray]:
        """Columns for these samples, in this order; must include `sample_id` and `task`."""
        ...


class SampleSource(Protocol):
    """The rank-side index of a dataset (LeRobot files or shards)."""

    def reader(
        self, sample_ids: np.ndarray, frame_size: tuple[int, int] | None = None
    ) -> SampleRead:
        """`frame_size` (H, W): every camera resized to it (with `image_ops`) as decoded."""
        ...


class Postprocess(Protocol):
    """Runs in the read task after decoding, e.g. resize + keyed augmentation."""

    def __call__(
        self, cols: dict[str, np.ndarray], epochs: np.ndarray
    ) -> dict[str, np.ndarray]: ...


def _configure_context() -> None:
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    # A segment is one map operator over in-memory items: the per-operator resource reservation
    # protects nothing here, and on small nodes it serialises the segment's read tasks.
    ctx.op_resource_reservation_enabled = False
    # One small execution per segment: banners, stats and progress bars would drown the log.
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # Spend Ray Data's one-time "progress bars disabled" warning: disabling them was our choice.
    log_once("ray_data_progress_manager_disabled")


LEAD_FRACTION = 8  # the stream's first read task is cut to this fraction of its samples


def _split_lead(
    task: tuple[np.ndarray, np.ndarray], micro_batch: int, fraction: int = LEAD_FRACTION
) -> tuple[tuple[np.ndarray, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """The stream's first task, cut to its first 1/`fraction` (whole micro-batches): it
    forms a segment of its own, so the first batch waits for one small decode instead of a
    whole segment of full tasks, and the next segment starts decoding at once. The order of
    the samples, and so everything keyed by them, is unchanged."""
    ids, epochs = task
    lead = max(micro_batch, len(ids) // fraction // micro_batch * micro_batch)
    if lead >= len(ids):
        return task, []
    return (ids[:lead], epochs[:lead]), [(ids[lead:], epochs[lead:])]


def _read_fn(post: Postprocess | None):
    def read(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (blob,) = batch["read"]
        cols = pickle.loads(blob).read()
        if post is not None:
            cols = post(cols, np.asarray(batch["epochs"][0], dtype=np.int64))
        return cols

    return read


def _materialize(
    source: SampleSource,
    tasks: list[tuple[np.ndarray, np.ndarray]],
    num_cpus: float,
    post: Postprocess | None,
    frame_size: tuple[int, int] | None = None,
) -> ray.data.Dataset:
    _configure_context()
    # Pickled here: Arrow stores the bytes as they are (a Python object column would be pickled
    # anyway, after a conversion attempt and a warning per process).
    items = [
        {"read": pickle.dumps(source.reader(ids, frame_size)), "epochs": epochs}
        for ids, epochs in tasks
    ]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(_read_fn(post), batch_size=1, num_cpus=num_cpus, zero_copy_batch=True)
    return ds.materialize()


def iter_rank_batches(
    source: SampleSource,
    work: np.ndarray | Iterable[tuple[np.ndarray, np.ndarray]],
    micro_batch: int,
    samples_per_task: int = 512,
    tasks_per_segment: int = 4,
    num_cpus_per_task: float = 1.0,
    epochs: np.ndarray | None = None,
    post: Postprocess | None = None,
    frame_size: tuple[int, int] | None = None,
    lead_fraction: int = LEAD_FRACTION,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield this rank's micro-batches (numpy columns) in plan order.

    `work` is an id array (with `epochs`, one per id, keying augmentation) or an iterable of
    (ids, epochs) read tasks such as `cut_tasks` yields; `post` runs inside the read tasks.
    `frame_size` (the processor's `frame_size`) has cameras resized as they are decoded.
    The first task is cut to 1/`lead_fraction` (`_split_lead`) and decoded alone, while the
    first full segment decodes beside it; with 1, the first segment is a full one.
    """
    _configure_context()
    if isinstance(work, np.ndarray):
        epochs = np.zeros(len(work), np.int64) if epochs is None else np.asarray(epochs, np.int64)
        if epochs.shape != (len(work),):
            raise ValueError(f"{len(work)} work ids but epochs of shape {epochs.shape}")
        tasks: Iterator = cut_tasks([(work, epochs)], samples_per_task, micro_batch)
    else:
        tasks = iter(work)
    head = next(tasks, None)
    if head is None:
        return
    lead: list[list[tuple[np.ndarray, np.ndarray]]] = []
    if lead_fraction > 1:
        first, rest = _split_lead(head, micro_batch, lead_fraction)
        lead, tasks = [[first]], chain(rest, tasks)
    else:
        tasks = chain([head], tasks)
    segments = chain(lead, iter(lambda: list(islice(tasks, tasks_per_segment)), []))
    # With a lead, two segments are in flight at the start (the lead and the first full one),
    # so the CPUs the small lead leaves idle decode ahead. From then on one is in flight while
    # the loop consumes one.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="raytrain-vla-read") as pool:

        def submit(segment: list[tuple[np.ndarray, np.ndarray]]) -> Future:
            return pool.submit(_materialize, source, segment, num_cpus_per_task, post, frame_size)

        in_flight = deque(submit(s) for s in islice(segments, 1 + len(lead)))
        while in_flight:
            ds = in_flight.popleft().result()
            if not in_flight:
                in_flight.extend(submit(s) for s in islice(segments, 1))
            yield from _segment_batches(ds, micro_batch)


def _segment_batches(ds: ray.data.Dataset, micro_batch: int) -> Iterator[dict[str, np.ndarray]]:
    """Micro-batches of a materialised segment, in block order (the last one may be short).

    The next block's transfer is started before the current one is sliced: a non-blocking
    `ray.wait(fetch_local=True)`, as Ray Data's own prefetcher does, without its thread.
    """
    refs = [ref for bundle in ds.iter_internal_ref_bundles() for ref in bundle.block_refs]
    carry: dict[str, np.ndarray] | None = None
    for i, ref in enumerate(refs):
        if i + 1 < len(refs):
            ray.wait(refs[i + 1 : i + 2], timeout=0, fetch_local=True)
        cols = BlockAccessor.for_block(ray.get(ref)).to_batch_format("numpy")
        rows, start = len(next(iter(cols.values()))), 0
        if carry is not None:
            start = min(micro_batch - len(carry["sample_id"]), rows)
            carry = {k: np.concatenate([v, cols[k][:start]]) for k, v in carry.items()}
            if len(carry["sample_id"]) < micro_batch:
                continue
            yield carry
            carry = None
        while rows - start >= micro_batch:
            yield {k: v[start : start + micro_batch] for k, v in cols.items()}
            start += micro_batch
        if start < rows:
            carry = {k: v[start:] for k, v in cols.items()}
    if carry is not None:
        yield carry
