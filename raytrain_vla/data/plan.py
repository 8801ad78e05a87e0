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
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from raytrain_vla.data.index_shuffle import index_shuffle, index_unshuffle, round_keys

PLAN_VERSION = 2
BLOCK = 256  # spans per block whose summed lengths are kept per epoch
GROUP = 32  # segments of the run table per anchor (a multiple of 8: whole bytes of flags)
_SPAN_ORDER, _WINDOW = 0, 1  # key tags, so the two shuffles never share keys
_BLOCK_CACHE = 2  # the block a step ends in is the next one's first
_LOOKUP_CHUNK = 4096  # spans decoded at once: bounded (chunk, GROUP) scratch


def runs_of(sample_ids: np.ndarray, episode_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first id, length) of every run of consecutive ids within one episode."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    if not len(ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero((np.diff(episode_of) != 0) | (np.diff(ids) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [len(ids)]]))
    return ids[starts], lengths.astype(np.int64)


def _narrowest(values: np.ndarray, largest: int, smallest: int = 0) -> np.ndarray:
    """`values` in the narrowest integer type that holds [smallest, largest]: the run table is
    the only plan state that grows with the dataset, so it is kept at 2 bytes a column where
    the ids allow."""
    for dtype in (np.uint16, np.int16, np.int32, np.int64):
        if np.iinfo(dtype).min <= smallest and largest <= np.iinfo(dtype).max:
            return np.asarray(values).astype(dtype)
    raise ValueError(f"[{smallest}, {largest}] does not fit in int64")


class Spans:
    """Runs cut into spans of <= span_len consecutive samples, addressed by span number.

    The runs are held as a sequence of segments: each run, preceded by a jump segment where it
    does not start at the previous run's end (held-out episodes, or runs out of order). That is
    one column of segment lengths (2 bytes each where they fit), one bit per segment saying
    which are runs, and every GROUP segments an anchor (first id, spans before it): about
    2.4 bytes a run. A lookup decodes the one group its span falls in; everything read from
    the columns is widened to int64 before any arithmetic."""

    def __init__(self, run_start: np.ndarray, run_length: np.ndarray, span_len: int):
        if span_len < 1:
            raise ValueError(f"span_len must be >= 1, got {span_len}")
        keep = np.asarray(run_length) > 0
        start = np.asarray(run_start, dtype=np.int64)[keep]
        length = np.asarray(run_length, dtype=np.int64)[keep]
        self.span_len = span_len
        self.count = int((-(-length // span_len)).sum())
        self.num_samples = int(length.sum())
        self.origin = int(start[0]) if len(start) else 0
        jump = start - np.concatenate([[self.origin], (start + length)[:-1]])
        has_jump = jump != 0
        run_segment = np.arange(len(start)) + np.cumsum(has_jump)
        self.num_segments = len(start) + int(has_jump.sum())
        seg = np.zeros(self.num_segments, np.int64)
        is_run = np.zeros(self.num_segments + -self.num_segments % GROUP, bool)
        seg[run_segment], is_run[run_segment] = length, True
        seg[run_segment[has_jump] - 1] = jump[has_jump]
        self.segment_length = _narrowest(seg, int(seg.max(initial=0)), int(seg.min(initial=0)))
        self.segment_is_run = np.packbits(is_run)  # GROUP // 8 bytes per group
        spans = np.where(is_run[: self.num_segments], -(-seg // span_len), 0)
        anchors = np.arange(0, self.num_segments, GROUP)
        id_before = np.concatenate([[0], np.cumsum(seg)])[anchors]  # from origin
        self.anchor_id = _narrowest(id_before, int(id_before.max(initial=0)),
                                    int(id_before.min(initial=0)))  # fmt: skip
        span_before = np.concatenate([[0], np.cumsum(spans)])[anchors]
        self.anchor_span = _narrowest(span_before, self.count)

    def _group_runs(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment lengths, is-run flags) of each group, one row of GROUP per group; the
        segments past the last are empty jumps."""
        index = group[:, None] * GROUP + np.arange(GROUP)
        seg = self.segment_length[np.minimum(index, self.num_segments - 1)].astype(np.int64)
        seg[index >= self.num_segments] = 0
        bits = self.segment_is_run.reshape(-1, GROUP // 8)[group]
        return seg, np.unpackbits(bits, axis=1).astype(bool)

    def bounds(self, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first sample id, length) of each span number."""
        span = np.asarray(span, dtype=np.int64)
        if len(span) <= _LOOKUP_CHUNK:
            return self._bounds(span)
        parts = [
            self._bounds(span[i : i + _LOOKUP_CHUNK]) for i in range(0, len(span), _LOOKUP_CHUNK)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _bounds(self, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`bounds` of one chunk: (len(span), GROUP) scratch."""
        anchors = self.anchor_span  # spans < count fit its type: no widened copy of it
        group = np.searchsorted(anchors, span.astype(anchors.dtype), side="right") - 1
        local = span - anchors[group].astype(np.int64)
        seg, is_run = self._group_runs(group)
        spans = np.where(is_run, -(-seg // self.span_len), 0)
        spans_end = np.cumsum(spans, axis=1)
        rows = np.arange(len(span))
        at = (spans_end <= local[:, None]).sum(axis=1)  # the run holding the span
        run_first = np.cumsum(seg, axis=1)[rows, at] - seg[rows, at]
        k = local - (spans_end[rows, at] - spans[rows, at])
        start = self.origin + self.anchor_id[group].astype(np.int64) + run_first + k * self.span_len
        return start, np.minimum(self.span_len, seg[rows, at] - k * self.span_len)

    def iter_runs(self, segments_at_once: int = 1 << 16) -> Iterator[tuple[np.ndarray, ...]]:
        """(first id, length, first span number) of the runs in order, decoded a chunk of
        segments at a time, so a pass over every run holds O(chunk), never the whole table."""
        step = max(GROUP, segments_at_once // GROUP * GROUP)
        for first in range(0, self.num_segments, step):
            seg = self.segment_length[first : first + step].astype(np.int64)
            bits = self.segment_is_run[first // 8 : (first + len(seg) + 7) // 8]
            is_run = np.unpackbits(bits)[: len(seg)].astype(bool)
            group = first // GROUP
            id_end = self.origin + int(self.anchor_id[group]) + np.cumsum(seg)
            spans = np.where(is_run, -(-seg // self.span_len), 0)
            span_end = int(self.anchor_span[group]) + np.cumsum(spans)
            yield (id_end - seg)[is_run], seg[is_run], (span_end - spans)[is_run]

    def all(self) -> list[np.ndarray]:
        """Every span's sample ids in span-number order (small datasets and tests only)."""
        start, length = self.bounds(np.arange(self.count))
        return [np.arange(s, s + n) for s, n in zip(start, length, strict=True)]

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (self.segment_length, self.segment_is_run, self.anchor_id, self.anchor_span)
        )


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
        """(span-order keys, end position of each block of BLOCK shuffled spans) for `epoch`.

        A block's length is BLOCK full spans less what its short spans lack, and only a run's
        last span can be short; so one pass over the runs puts each short span in its block
        by the inverse shuffle: O(runs) per epoch, O(spans / BLOCK) kept."""
        if self._epoch_blocks is None or self._epoch_blocks[0] != epoch:
            keys = round_keys((self.seed, epoch, _SPAN_ORDER))
            count, span_len = self.spans.count, self.spans.span_len
            blocks = -(-count // BLOCK)
            lacking = np.zeros(blocks, np.int64)
            for _, length, first_span in self.spans.iter_runs():
                spans = -(-length // span_len)
                lack = spans * span_len - length
                short = np.flatnonzero(lack)
                where = index_unshuffle(first_span[short] + spans[short] - 1, count, keys)
                np.add.at(lacking, where // BLOCK, lack[short])
            full = np.full(blocks, BLOCK * span_len, np.int64)
            full[-1] = (count - (blocks - 1) * BLOCK) * span_len
            ends = np.cumsum(full - lacking)
            self._epoch_blocks = (epoch, keys, _narrowest(ends, int(ends[-1])))
        return self._epoch_blocks[1], self._epoch_blocks[2]

    def _fill_blocks(self, epoch: int, blocks: np.ndarray, keys: np.ndarray) -> None:
        """Cache (first sample id, start position within the block) of the spans of each of
        `blocks` in shuffled order; the missing ones in one vectorised pass."""
        missing = np.array([b for b in blocks.tolist() if (epoch, b) not in self._blocks], np.int64)
        if len(missing):
            lo = missing * BLOCK
            sizes = np.minimum(lo + BLOCK, self.spans.count) - lo
            ends = np.cumsum(sizes)
            order = np.arange(ends[-1]) + np.repeat(lo - (ends - sizes), sizes)
            start, length = self.spans.bounds(index_shuffle(order, self.spans.count, keys))
            for b, a, e in zip(
                missing.tolist(), (ends - sizes).tolist(), ends.tolist(), strict=True
            ):
                first, size = start[a:e], length[a:e]
                span_pos = np.cumsum(size) - size
                self._blocks[(epoch, b)] = (
                    _narrowest(first, int(first.max())),
                    _narrowest(span_pos, int(span_pos[-1])),
                )
        for b in blocks.tolist():
            self._blocks.move_to_end((epoch, b))

    def _spans_at(self, epoch: int, flat: np.ndarray) -> np.ndarray:
        """Sample ids at positions of the shuffled span sequence (before the window shuffle)."""
        keys, block_end = self._block_ends(epoch)  # positions < num_samples fit its type
        block = np.searchsorted(block_end, flat.astype(block_end.dtype), side="right")
        needed = np.unique(block)
        self._fill_blocks(epoch, needed, keys)
        out = np.empty(len(flat), np.int64)
        for b in needed.tolist():
            sel = np.flatnonzero(block == b)
            local = flat[sel] - (int(block_end[b - 1]) if b else 0)
            first_id, span_pos = self._blocks[(epoch, b)]
            i = np.searchsorted(span_pos, local, side="right") - 1
            out[sel] = first_id[i].astype(np.int64) + local - span_pos[i]
        while len(self._blocks) > _BLOCK_CACHE:  # all the call needed were held until here
            self._blocks.popitem(last=False)
        return out

    def ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """P_e[positions]: the window shuffle, then the span sequence."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.num_samples):
            raise IndexError(f"positions outside epoch of {self.num_samples} samples")
        window = self.shuffle_window
        if window <= 1 or not pos.size:
            return self._spans_at(epoch, pos)
        windows, which = np.unique(pos // window, return_inverse=True)
        keys = np.stack([round_keys((self.seed, epoch, _WINDOW, w)) for w in windows.tolist()], 1)
        base = windows * window
        size = np.minimum(window, self.num_samples - base)
        flat = np.empty_like(pos)
        for n in np.unique(size).tolist():  # all full windows in one pass; a short last one
            sel = np.flatnonzero(size[which] == n)
            w = which[sel]
            flat[sel] = base[w] + index_shuffle(pos[sel] - base[w], n, keys[:, w])
        return self._spans_at(epoch, flat)

    def first_ids(self, n: int) -> np.ndarray:
        """The first `n` training sample ids in id order (tools and benchmarks)."""
        parts, left = [], n
        for start, length, _ in self.spans.iter_runs(segments_at_once=GROUP * 8):
            for first, size in zip(start.tolist(), length.tolist(), strict=True):
                if left <= 0:
                    return np.concatenate(parts)
                parts.append(np.arange(first, first + min(size, left), dtype=np.int64))
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
