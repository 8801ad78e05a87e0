"""Read tasks: a rank's work, in plan order, cut into the tasks Ray Data decodes.

A task is (ids, epoch per id). Tasks end on micro-batch boundaries and hold at most a capped
number of samples; cut along shuffle windows, a task holds whole windows (each decodes its
spans' frames together), packed while the next fits, and never two epochs. Concatenated, the
tasks are always exactly the work, in its order: cutting decides where tasks end, never which
samples they hold or in what order. Every way of cutting goes through `_TaskBuffer`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

import numpy as np

Task = tuple[np.ndarray, np.ndarray]  # (sample ids, epoch of each)
Step = tuple[np.ndarray, int | np.ndarray]  # (ids, their epoch or an epoch per id)


def task_size(samples_per_task: int, micro_batch: int) -> int:
    """Samples per read task: a multiple of the micro-batch, so tasks end on its boundaries."""
    return max(micro_batch, samples_per_task // micro_batch * micro_batch)


def capped_task_size(max_samples: int, max_mb: int, sample_bytes: int, micro_batch: int) -> int:
    """`max_samples`, lowered so a task's decoded frames (`sample_bytes` a sample) stay within
    `max_mb` MiB; whole micro-batches, at least one."""
    fit = max_mb * 2**20 // max(sample_bytes, 1) // micro_batch * micro_batch
    return max(micro_batch, min(max_samples, fit))


class _TaskBuffer:
    """The samples pulled from the work but not yet in a task, in order: the one place tasks
    are cut. Taking from the front never copies what stays held, so cutting one long work
    array costs O(work), not O(work x tasks)."""

    def __init__(self, size: int):
        self.size = size
        self.ids: deque[np.ndarray] = deque()
        self.epochs: deque[np.ndarray] = deque()
        self.held = 0

    def push(self, step_ids: np.ndarray, epoch: int | np.ndarray) -> None:
        ids = np.asarray(step_ids, np.int64)
        self.ids.append(ids)
        self.epochs.append(np.broadcast_to(np.asarray(epoch, np.int64), len(ids)).copy())
        self.held += len(ids)

    def take(self, n: int) -> Task:
        """The first `n` held samples as one task."""
        ids: list[np.ndarray] = []
        epochs: list[np.ndarray] = []
        self.held -= n
        while n:
            front, front_epochs = self.ids[0], self.epochs[0]
            if len(front) <= n:
                ids.append(self.ids.popleft())
                epochs.append(self.epochs.popleft())
                n -= len(front)
            else:
                ids.append(front[:n])
                epochs.append(front_epochs[:n])
                self.ids[0], self.epochs[0] = front[n:], front_epochs[n:]
                n = 0
        return np.concatenate(ids), np.concatenate(epochs)

    def full(self) -> Iterator[Task]:
        """Every full task held."""
        while self.held >= self.size:
            yield self.take(self.size)

    def rest(self) -> Iterator[Task]:
        """What is held, as one task."""
        if self.held:
            yield self.take(self.held)


def read_tasks(work: np.ndarray, samples_per_task: int, micro_batch: int) -> list[np.ndarray]:
    """Split one work array (ids, or any per-sample values) into read tasks' parts."""
    return [ids for ids, _ in cut_tasks([(work, 0)], samples_per_task, micro_batch)]


def cut_tasks(
    steps: Iterable[Step],
    samples_per_task: int,
    micro_batch: int,
    groups: Iterable[tuple[int, int]] | None = None,
    per_step: int = 0,
) -> Iterator[Task]:
    """(ids, epoch per id) read tasks from per-step (ids, epoch or epoch per id) work, holding
    one task's worth at a time. Without `groups`, every task but the last is full.

    With `groups` (one (epoch, window) key per step, `SamplePlan.window_groups`) and every step
    `per_step` samples, a task holds whole groups, packed while the next one fits, so that no
    group's samples are split between tasks (each task decodes its windows' spans together)
    unless one group alone exceeds the size; and a task never spans two epochs. Where a task
    ends is decided from the keys alone, so a step's ids are computed only when its own task
    is: the next epoch's order, or the plan's next batch of steps, never for a look ahead.
    """
    buffer = _TaskBuffer(task_size(samples_per_task, micro_batch))
    if groups is None:
        for step_ids, epoch in steps:
            buffer.push(step_ids, epoch)
            yield from buffer.full()
        yield from buffer.rest()
        return
    if per_step < 1:
        raise ValueError(f"cutting by groups needs the samples per step, got {per_step}")
    steps = iter(steps)
    count, current = 0, None
    for key in groups:
        if count and key != current:
            yield from _add_group(buffer, steps, count, count * per_step, key[0] != current[0])
            count = 0
        current = key
        count += 1
    if count:
        yield from _add_group(buffer, steps, count, count * per_step, epoch_ends=True)


def _add_group(
    buffer: _TaskBuffer, steps: Iterator[Step], count: int, samples: int, epoch_ends: bool
) -> Iterator[Task]:
    """The tasks a group of `count` steps (`samples` samples) completes: the open task first
    if the group does not fit in it (before the group's ids are read), then full tasks if the
    group alone is larger, then the rest at an epoch's end."""
    if buffer.held and buffer.held + samples > buffer.size:
        yield from buffer.rest()
    for _ in range(count):
        buffer.push(*next(steps))
    yield from buffer.full()
    if epoch_ends:
        yield from buffer.rest()


class RankPlan(Protocol):
    """What cutting read tasks needs of a plan (`SamplePlan`, `MixturePlan`)."""

    global_batch_size: int
    shuffle_window: int

    def iter_rank_work(
        self, start_step: int, end_step: int, rank: int, world_size: int
    ) -> Iterator[Step]: ...

    def window_groups(
        self, start_step: int, end_step: int, rank: int, world_size: int
    ) -> Iterator[tuple[int, int]]: ...


def rank_read_tasks(
    plan: RankPlan, start_step: int, end_step: int, rank: int, world_size: int,
    max_samples: int, micro_batch: int, follow_windows: bool = True,
) -> Iterator[Task]:  # fmt: skip
    """The rank's read tasks for steps [start_step, end_step) as training cuts them: at most
    `max_samples` each, ending on micro-batch boundaries and, when `follow_windows` and a
    shuffle window spans at least one global batch, holding whole shuffle windows (packed up
    to `max_samples`, never two epochs; see `cut_tasks`)."""
    steps = plan.iter_rank_work(start_step, end_step, rank, world_size)
    follow = follow_windows and plan.shuffle_window >= plan.global_batch_size
    groups = plan.window_groups(start_step, end_step, rank, world_size) if follow else None
    return cut_tasks(steps, max_samples, micro_batch, groups, plan.global_batch_size // world_size)
