"""The deterministic, elastic sample plan (DESIGN.md): a pure function of (samples, seed, epoch, G).

Spans of consecutive frames keep video decoding sequential; a seeded span shuffle plus a windowed
sample shuffle mixes the order. Global step k reads P_e[kG:(k+1)G] and rank r of W reads its
contiguous slice, so the set of samples in each global batch never depends on the world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def build_spans(sample_ids: np.ndarray, episode_of: np.ndarray, span_len: int) -> list[np.ndarray]:
    """Split samples (sorted global frame indices) into runs of <= span_len within one episode."""
    if span_len < 1:
        raise ValueError(f"span_len must be >= 1, got {span_len}")
    spans: list[np.ndarray] = []
    if len(sample_ids) == 0:
        return spans
    # A new run starts where the episode changes or the frame indices are not consecutive.
    breaks = np.flatnonzero((np.diff(episode_of) != 0) | (np.diff(sample_ids) != 1)) + 1
    for run in np.split(sample_ids, breaks):
        spans.extend(run[i : i + span_len] for i in range(0, len(run), span_len))
    return spans


def epoch_permutation(
    spans: list[np.ndarray], seed: int, epoch: int, shuffle_window: int
) -> np.ndarray:
    """P_e: the span order shuffled, then samples shuffled inside consecutive windows."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(spans))
    flat = np.concatenate([spans[i] for i in order]) if spans else np.zeros(0, np.int64)
    if shuffle_window > 1:
        for start in range(0, len(flat), shuffle_window):
            window = flat[start : start + shuffle_window]
            flat[start : start + shuffle_window] = window[rng.permutation(len(window))]
    return flat.astype(np.int64)


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

    def __init__(
        self,
        sample_ids: np.ndarray,
        episode_of: np.ndarray,
        seed: int,
        global_batch_size: int,
        span_len: int = 16,
        shuffle_window: int = 2048,
    ):
        if len(sample_ids) < global_batch_size:
            raise ValueError(
                f"the training split has {len(sample_ids)} samples, fewer than one global batch "
                f"({global_batch_size})"
            )
        self.sample_ids = np.asarray(sample_ids, dtype=np.int64)
        self.spans = build_spans(self.sample_ids, np.asarray(episode_of), span_len)
        self.seed = seed
        self.global_batch_size = global_batch_size
        self.shuffle_window = shuffle_window
        self.steps_per_epoch = len(self.sample_ids) // global_batch_size
        self._cache: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            self._cache = {
                epoch: epoch_permutation(self.spans, self.seed, epoch, self.shuffle_window)
            }
        return self._cache[epoch]

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
        return self.permutation(cursor.epoch)[start : start + self.global_batch_size]

    def rank_slice(self, step: int, rank: int, world_size: int) -> np.ndarray:
        if self.global_batch_size % world_size:
            raise ValueError(
                f"global batch {self.global_batch_size} is not divisible by world size {world_size}"
            )
        per_rank = self.global_batch_size // world_size
        return self.global_batch(step)[rank * per_rank : (rank + 1) * per_rank]

    def rank_work(self, start_step: int, end_step: int, rank: int, world_size: int) -> np.ndarray:
        """Every sample rank `rank` reads for steps [start_step, end_step), in plan order.

        Steps before `start_step` are never touched, so resuming is O(1) in the position.
        """
        parts = [self.rank_slice(s, rank, world_size) for s in range(start_step, end_step)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def rank_work_epochs(self, start_step: int, end_step: int, world_size: int) -> np.ndarray:
        """The epoch of every sample in `rank_work(start_step, end_step, ...)`, for keyed augmentation."""
        steps = np.arange(start_step, end_step, dtype=np.int64)
        return np.repeat(steps // self.steps_per_epoch, self.global_batch_size // world_size)
