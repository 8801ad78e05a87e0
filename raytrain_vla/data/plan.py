"""The deterministic, elastic sample plan (DESIGN.md): a pure function of (samples, seed, epoch, G).

Spans of consecutive frames keep video decoding sequential; a seeded span shuffle plus a windowed
sample shuffle mixes the order. Global step k reads P_e[kG:(k+1)G] and rank r of W reads its
contiguous slice, so the set of samples in each global batch never depends on the world size.

Unlike DESIGN.md's `default_rng([seed, epoch]).permutation`, both shuffles are keyed bijections
evaluated per position (`index_shuffle`), so P_e is never built: a rank computes the G/W
positions it reads, and memory is O(runs + spans / BLOCK) whatever the dataset size or step.
Plan version 2 names this order; checkpoints record it so a resume never switches orders.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from raytrain_vla.data.index_shuffle import index_shuffle, round_keys

PLAN_VERSION = 2
BLOCK = 4096  # spans per block whose summed lengths are kept per epoch
_SPAN_ORDER, _WINDOW = 0, 1  # key tags, so the two shuffles never share keys
_BLOCK_CACHE = 4


def runs_of(sample_ids: np.ndarray, episode_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first id, length) of every run of consecutive ids within one episode."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero((np.diff(episode_of) != 0) | (np.diff(ids) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [len(ids)]]))
    return ids[starts], lengths.astype(np.int64)


def _narrowest(values: np.ndarray, largest: int) -> np.ndarray:
    """`values` in the narrowest unsigned or signed integer type that holds `largest`: the run
    table is the only plan state that grows with the dataset, so it is kept at 2-4 bytes a
    column where the ids allow."""
    for dtype in (np.uint16, np.int32, np.int64):
        if largest <= np.iinfo(dtype).max:
            return np.asarray(values).astype(dtype)
    raise ValueError(f"{largest} does not fit in int64")


class Spans:
    """Runs cut into spans of <= span_len consecutive samples, addressed by span number.

    Holds three narrow columns per run (first id, length, span edges); everything read from
    them is widened to int64 before any arithmetic."""

    def __init__(self, run_start: np.ndarray, run_length: np.ndarray, span_len: int):
        if span_len < 1:
            raise ValueError(f"span_len must be >= 1, got {span_len}")
        keep = np.asarray(run_length) > 0
        start = np.asarray(run_start, dtype=np.int64)[keep]
        length = np.asarray(run_length, dtype=np.int64)[keep]
        self.span_len = span_len
        edges = np.concatenate([[0], np.cumsum(-(-length // span_len))])
        self.count = int(edges[-1])
        self.num_samples = int(length.sum())
        self.run_start = _narrowest(start, int((start + length).max()) if len(start) else 0)
        self.run_length = _narrowest(length, int(length.max()) if len(length) else 0)
        self.run_span_edges = _narrowest(edges, self.count)  # run r holds spans [e[r], e[r+1])

    def bounds(self, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first sample id, length) of each span number."""
        span = np.asarray(span, dtype=np.int64)
        edges = self.run_span_edges  # spans < count fit its type: no widened copy of it
        run = np.searchsorted(edges, span.astype(edges.dtype), side="right") - 1
        k = span - edges[run].astype(np.int64)
        start = self.run_start[run].astype(np.int64) + k * self.span_len
        left = self.run_length[run].astype(np.int64) - k * self.span_len
        return start, np.minimum(self.span_len, left)

    def all(self) -> list[np.ndarray]:
        """Every span's sample ids in span-number order (small datasets and tests only)."""
        start, length = self.bounds(np.arange(self.count))
        return [np.arange(s, s + n) for s, n in zip(start, length, strict=True)]

    @property
    def nbytes(self) -> int:
        return self.run_start.nbytes + self.run_length.nbytes + self.run_span_edges.nbytes


@dataclass(frozen=True)
class Cursor:
    """Where the data stream stands: the next unread position of epoch `epoch`."""

    epoch: int
    sample_in_epoch: int

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch}

    @classmethod
    def from_dict(cls, d: dict) -> Cursor:
        return cls(int(d["epoch"]), int(d["sample_in_epoch"]))


class SamplePlan:
    """Global batches and per-rank slices over an endless sequence of epochs.

    Each epoch drops its last partial global batch so that every step has exactly G samples.
    """

    version = PLAN_VERSION

    def __init__(
        self,
        sample_ids: np.ndarray,
        episode_of: np.ndarray,
        seed: int,
        global_batch_size: int,
        span_len: int = 16,
        shuffle_window: int = 2048,
    ):
        run_start, run_length = runs_of(sample_ids, np.asarray(episode_of))
        self._init(Spans(run_start, run_length, span_len), seed, global_batch_size, shuffle_window)

    @classmethod
    def from_runs(
        cls, run_start: np.ndarray, run_length: np.ndarray, seed: int, global_batch_size: int,
        span_len: int = 16, shuffle_window: int = 2048,
    ) -> SamplePlan:  # fmt: skip
        """A plan over runs of consecutive ids (e.g. the training episodes), in O(runs)."""
        plan = cls.__new__(cls)
        plan._init(Spans(run_start, run_length, span_len), seed, global_batch_size, shuffle_window)
        return plan

    def _init(self, spans: Spans, seed: int, global_batch_size: int, shuffle_window: int) -> None:
        if spans.num_samples < global_batch_size:
            raise ValueError(
                f"the training split has {spans.num_samples} samples, fewer than one global "
                f"batch ({global_batch_size})"
            )
        self.spans = spans
        self.seed = seed
        self.global_batch_size = global_batch_size
        self.shuffle_window = shuffle_window
        self.num_samples = spans.num_samples
        self.steps_per_epoch = self.num_samples // global_batch_size
        self._epoch_blocks: tuple[int, np.ndarray, np.ndarray] | None = None
        self._blocks: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()

    # -- P_e, position by position -------------------------------------------------------
    def _block_ends(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(span-order keys, end position of each block of BLOCK shuffled spans) for `epoch`:
        one O(spans) pass per epoch, O(spans / BLOCK) kept."""
        if self._epoch_blocks is None or self._epoch_blocks[0] != epoch:
            keys = round_keys((self.seed, epoch, _SPAN_ORDER))
            sums, step = [], BLOCK * 16  # bounded scratch memory
            for start in range(0, self.spans.count, step):
                order = np.arange(start, min(start + step, self.spans.count))
                _, length = self.spans.bounds(index_shuffle(order, self.spans.count, keys))
                sums.append(np.add.reduceat(length, np.arange(0, len(order), BLOCK)))
            self._epoch_blocks = (epoch, keys, np.cumsum(np.concatenate(sums)))
        return self._epoch_blocks[1], self._epoch_blocks[2]

    def _block(self, epoch: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(first sample id, start position within the block) of the block's spans in order."""
        if (epoch, block) not in self._blocks:
            keys, _ = self._block_ends(epoch)
            order = np.arange(block * BLOCK, min((block + 1) * BLOCK, self.spans.count))
            start, length = self.spans.bounds(index_shuffle(order, self.spans.count, keys))
            span_pos = np.cumsum(length) - length
            self._blocks[(epoch, block)] = (
                _narrowest(start, int(start.max())),
                _narrowest(span_pos, int(span_pos[-1])),
            )
            while len(self._blocks) > _BLOCK_CACHE:
                self._blocks.popitem(last=False)
        self._blocks.move_to_end((epoch, block))
        return self._blocks[(epoch, block)]

    def _spans_at(self, epoch: int, flat: np.ndarray) -> np.ndarray:
        """Sample ids at positions of the shuffled span sequence (before the window shuffle)."""
        _, block_end = self._block_ends(epoch)
        block = np.searchsorted(block_end, flat, side="right")
        out = np.empty(len(flat), np.int64)
        for b in np.unique(block):
            sel = np.flatnonzero(block == b)
            local = flat[sel] - (block_end[b - 1] if b else 0)
            first_id, span_pos = self._block(epoch, int(b))
            i = np.searchsorted(span_pos, local, side="right") - 1
            out[sel] = first_id[i].astype(np.int64) + local - span_pos[i]
        return out

    def ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """P_e[positions]: the window shuffle, then the span sequence."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.num_samples):
            raise IndexError(f"positions outside epoch of {self.num_samples} samples")
        window = self.shuffle_window
        if window <= 1:
            return self._spans_at(epoch, pos)
        flat = np.empty_like(pos)
        w_of = pos // window
        for w in np.unique(w_of):
            sel = np.flatnonzero(w_of == w)
            base = int(w) * window
            size = min(window, self.num_samples - base)
            flat[sel] = base + index_shuffle(pos[sel] - base, size, (self.seed, epoch, _WINDOW, w))
        return self._spans_at(epoch, flat)

    def first_ids(self, n: int) -> np.ndarray:
        """The first `n` training sample ids in id order (tools and benchmarks)."""
        parts, left = [], n
        for start, length in zip(self.spans.run_start, self.spans.run_length, strict=True):
            if left <= 0:
                break
            start, length = int(start), int(length)  # narrow types would wrap in the sum
            parts.append(np.arange(start, start + min(length, left), dtype=np.int64))
            left -= parts[-1].size
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """All of P_e (tests and small datasets only: O(samples))."""
        return self.ids_at(epoch, np.arange(self.num_samples))

    # -- steps, ranks, cursors -----------------------------------------------------------
    def cursor_at(self, step: int) -> Cursor:
        """The cursor before global step `step` (0-based count of completed steps)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return Cursor(epoch, k * self.global_batch_size)

    def step_of(self, cursor: Cursor) -> int:
        if cursor.sample_in_epoch % self.global_batch_size:
            raise ValueError(f"cursor {cursor} is not on a global batch boundary")
        return (
            cursor.epoch * self.steps_per_epoch + cursor.sample_in_epoch // self.global_batch_size
        )

    def global_batch(self, step: int) -> np.ndarray:
        cursor = self.cursor_at(step)
        start = cursor.sample_in_epoch
        return self.ids_at(cursor.epoch, np.arange(start, start + self.global_batch_size))

    def _per_rank(self, world_size: int) -> int:
        if self.global_batch_size % world_size:
            raise ValueError(
                f"global batch {self.global_batch_size} is not divisible by world size {world_size}"
            )
        return self.global_batch_size // world_size

    def rank_slice(self, step: int, rank: int, world_size: int) -> np.ndarray:
        per_rank = self._per_rank(world_size)
        cursor = self.cursor_at(step)
        start = cursor.sample_in_epoch + rank * per_rank
        return self.ids_at(cursor.epoch, np.arange(start, start + per_rank))

    def iter_rank_work(
        self, start_step: int, end_step: int, rank: int, world_size: int, steps_at_once: int = 64
    ) -> Iterator[tuple[np.ndarray, int]]:
        """(ids, epoch) of each step rank `rank` reads in [start_step, end_step), computed as
        they are asked for (`steps_at_once` steps per vectorised pass): steps before
        `start_step` are never touched (O(1) resume), and nothing is held for later steps."""
        per_rank = self._per_rank(world_size)
        step = start_step
        while step < end_step:
            epoch = step // self.steps_per_epoch
            stop = min(end_step, step + steps_at_once, (epoch + 1) * self.steps_per_epoch)
            k = np.arange(step, stop) - epoch * self.steps_per_epoch
            pos = k[:, None] * self.global_batch_size + rank * per_rank + np.arange(per_rank)
            for ids in self.ids_at(epoch, pos.reshape(-1)).reshape(len(k), per_rank):
                yield ids, epoch
            step = stop

    def window_groups(
        self, start_step: int, end_step: int, rank: int, world_size: int
    ) -> Iterator[tuple[int, int]]:
        """(epoch, shuffle window) where each step's rank slice starts: read tasks cut on these
        hold samples of one window, i.e. of the few spans it shuffles, so a task decodes each
        of those spans' frames together instead of several tasks decoding the same GOPs."""
        per_rank = self._per_rank(world_size)
        window = max(self.shuffle_window, 1)
        for step in range(start_step, end_step):
            epoch, k = divmod(step, self.steps_per_epoch)
            yield epoch, (k * self.global_batch_size + rank * per_rank) // window

    def rank_work(self, start_step: int, end_step: int, rank: int, world_size: int) -> np.ndarray:
        """Every sample rank `rank` reads for steps [start_step, end_step), in plan order."""
        parts = [ids for ids, _ in self.iter_rank_work(start_step, end_step, rank, world_size)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def rank_work_epochs(self, start_step: int, end_step: int, world_size: int) -> np.ndarray:
        """The epoch of every sample in `rank_work(start_step, end_step, ...)`, for keyed augmentation."""
        steps = np.arange(start_step, end_step, dtype=np.int64)
        return np.repeat(steps // self.steps_per_epoch, self._per_rank(world_size))

    @property
    def nbytes(self) -> int:
        """Bytes the plan holds (index, per-epoch block ends and cached blocks)."""
        held = self.spans.nbytes + sum(a.nbytes + b.nbytes for a, b in self._blocks.values())
        if self._epoch_blocks is not None:
            held += self._epoch_blocks[1].nbytes + self._epoch_blocks[2].nbytes
        return held


# -- read tasks ----------------------------------------------------------------------------
def task_size(samples_per_task: int, micro_batch: int) -> int:
    """Samples per read task: a multiple of the micro-batch, so tasks end on its boundaries."""
    return max(micro_batch, samples_per_task // micro_batch * micro_batch)


def capped_task_size(max_samples: int, max_mb: int, sample_bytes: int, micro_batch: int) -> int:
    """`max_samples`, lowered so a task's decoded frames (`sample_bytes` a sample) stay within
    `max_mb` MiB; whole micro-batches, at least one."""
    fit = max_mb * 2**20 // max(sample_bytes, 1) // micro_batch * micro_batch
    return max(micro_batch, min(max_samples, fit))


def read_tasks(work: np.ndarray, samples_per_task: int, micro_batch: int) -> list[np.ndarray]:
    """Split a rank's work list into read tasks that end on micro-batch boundaries."""
    size = task_size(samples_per_task, micro_batch)
    return [work[i : i + size] for i in range(0, len(work), size)]


def _as_task(ids: list[np.ndarray], epochs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate(ids), np.concatenate(epochs)


def cut_tasks(
    steps: Iterable[tuple[np.ndarray, int | np.ndarray]],
    samples_per_task: int,
    micro_batch: int,
    groups: Iterable[tuple[int, int]] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, epoch per id) read tasks from per-step (ids, epoch or epoch per id) work, holding
    one task's worth at a time. Without `groups`, cut exactly as `read_tasks` cuts the
    concatenated work.

    With `groups` (one (epoch, window) key per step, `SamplePlan.window_groups`), a task holds
    whole groups, packed while the next one fits, so that no group's samples are split between
    tasks (each task decodes its windows' spans together) unless one group alone exceeds the
    size; and a task never spans two epochs. A key is read before its step's ids, so the next
    epoch's order is computed only when its first task is.
    """
    size = task_size(samples_per_task, micro_batch)
    if groups is None:
        yield from _cut_by_size(steps, size)
        return
    packer = _Packer(size)
    steps = iter(steps)
    ids: list[np.ndarray] = []
    epochs: list[np.ndarray] = []
    held, current = 0, None
    for key in groups:
        if held and key != current:
            yield from packer.add(ids, epochs, held, epoch_ends=key[0] != current[0])
            ids, epochs, held = [], [], 0
        current = key
        step_ids, epoch = next(steps)
        ids.append(np.asarray(step_ids, np.int64))
        epochs.append(np.broadcast_to(np.asarray(epoch, np.int64), len(step_ids)).copy())
        held += len(step_ids)
    if held:
        yield from packer.add(ids, epochs, held, epoch_ends=True)


class _Packer:
    """Whole groups of samples packed into tasks of at most `size`."""

    def __init__(self, size: int):
        self.size = size
        self.ids: list[np.ndarray] = []
        self.epochs: list[np.ndarray] = []
        self.held = 0

    def add(
        self, ids: list[np.ndarray], epochs: list[np.ndarray], held: int, epoch_ends: bool
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The tasks this group completes: the open task first if the group does not fit in
        it, then full tasks if the group alone is larger, then the rest at an epoch's end."""
        if self.held and self.held + held > self.size:
            yield self._take(self.held)
        self.ids, self.epochs, self.held = self.ids + ids, self.epochs + epochs, self.held + held
        while self.held >= self.size:
            yield self._take(self.size)
        if epoch_ends and self.held:
            yield self._take(self.held)

    def _take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        all_ids, all_epochs = _as_task(self.ids, self.epochs)
        self.ids, self.epochs, self.held = [all_ids[n:]], [all_epochs[n:]], self.held - n
        return all_ids[:n], all_epochs[:n]


def _cut_by_size(
    steps: Iterable[tuple[np.ndarray, int | np.ndarray]], size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    ids: list[np.ndarray] = []
    epochs: list[np.ndarray] = []
    held = 0
    for step_ids, epoch in steps:
        ids.append(np.asarray(step_ids, np.int64))
        epochs.append(np.broadcast_to(np.asarray(epoch, np.int64), len(step_ids)).copy())
        held += len(step_ids)
        while held >= size:
            all_ids, all_epochs = _as_task(ids, epochs)
            yield all_ids[:size], all_epochs[:size]
            ids, epochs, held = [all_ids[size:]], [all_epochs[size:]], held - size
    if held:
        yield _as_task(ids, epochs)


class RankPlan(Protocol):
    """What cutting read tasks needs of a plan (`SamplePlan`, `MixturePlan`)."""

    global_batch_size: int
    shuffle_window: int

    def iter_rank_work(
        self, start_step: int, end_step: int, rank: int, world_size: int
    ) -> Iterator[tuple[np.ndarray, int | np.ndarray]]: ...

    def window_groups(
        self, start_step: int, end_step: int, rank: int, world_size: int
    ) -> Iterator[tuple[int, int]]: ...


def rank_read_tasks(
    plan: RankPlan, start_step: int, end_step: int, rank: int, world_size: int,
    max_samples: int, micro_batch: int, follow_windows: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """The rank's read tasks for steps [start_step, end_step) as training cuts them: at most
    `max_samples` each, ending on micro-batch boundaries and, when `follow_windows` and a
    shuffle window spans at least one global batch, holding whole shuffle windows (packed up
    to `max_samples`, never two epochs; see `cut_tasks`)."""
    steps = plan.iter_rank_work(start_step, end_step, rank, world_size)
    follow = follow_windows and plan.shuffle_window >= plan.global_batch_size
    groups = plan.window_groups(start_step, end_step, rank, world_size) if follow else None
    return cut_tasks(steps, max_samples, micro_batch, groups)
