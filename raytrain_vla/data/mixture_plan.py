"""The sample plan of a weighted mixture of datasets: a pure function of (datasets, weights,
seed, step), with the guarantees of the single-dataset plan (`plan.py`).

Each dataset keeps its own `SamplePlan` and reads it as an endless stream: stream position s is
`plan.ids_at(s // N, s % N)`, so every dataset cycles its own epochs, and no sample repeats
before its dataset's epoch ends. Step k takes `C_d(k+1) - C_d(k)` samples from dataset d, the
next positions of d's stream, where `C_d(k)` (samples of d before step k) has a closed form:

* each step gives d `floor(G w_d)` slots, and the R slots left over go to R datasets chosen by
  systematic sampling: a point `u_k` in [0, 1) and its R shifts `u_k + j` fall in the intervals
  that tile [0, R) with lengths `frac(G w_d)`, so d gets an extra slot with probability
  `frac(G w_d)` and exactly R datasets get one;
* `u_k = frac(k * phi + seed phase)` (phi the golden ratio, as integers mod 2^32), so the count
  of d's extra slots before step k is a sum of floors of a linear function, which
  `floor_sum` evaluates in O(log) steps: resume at any step costs the same as step 0, and the
  realised share of d after k steps is within about log(k) / (k G) of w_d (a low-discrepancy
  sequence; i.i.d. draws would be off by about 1 / sqrt(k G)).

The G slots of a step are then put in a keyed random order, so every rank's contiguous slice
holds each dataset in proportion, and the global batch never depends on the world size.
Sample ids are global: dataset d's local id plus `offsets[d]` (the frames of the datasets
before it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from raytrain_vla.data.index_shuffle import index_shuffle, round_keys
from raytrain_vla.data.plan import PLAN_VERSION, Cursor, SamplePlan

_Q = 1 << 32  # shares are fixed-point numbers with this denominator
_PHI = 2654435769  # floor(2^32 / golden ratio): the step-to-step shift of the sampling point
_SLOTS, _PHASE = 2, 3  # key tags, distinct from the dataset plans' own


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{i=0}^{n-1} floor((a i + b) / m) for non-negative ints, in O(log m) (the Euclid-like
    reduction of AtCoder Library's `floor_sum`)."""
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b = divmod(top, m)
        m, a = a, m


class MixturePlan:
    """Global batches of G slots drawn from several datasets' plans by weight."""

    version = PLAN_VERSION
    shuffle_window = 0  # read tasks are cut by size only (rank_read_tasks)

    def __init__(
        self,
        plans: Sequence[SamplePlan],
        offsets: Sequence[int],
        weights: Sequence[float],
        seed: int,
        global_batch_size: int,
    ):
        if not plans or len(plans) != len(weights) or len(plans) != len(offsets):
            raise ValueError("a mixture needs one plan, offset and weight per dataset")
        w = np.asarray(weights, dtype=np.float64)
        if not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"mixture weights must be positive numbers, got {list(weights)}")
        self.plans = list(plans)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.seed = seed
        self.global_batch_size = G = global_batch_size
        self.num_samples = sum(p.num_samples for p in self.plans)
        # Cumulative shares in units of 1/_Q, exact integers summing to G * _Q.
        cum = np.cumsum(w) / w.sum()
        ends = [round(G * _Q * float(c)) for c in cum[:-1]] + [G * _Q]
        starts = [0, *ends[:-1]]
        share = [e - s for s, e in zip(starts, ends, strict=True)]
        self.base = np.array([s // _Q for s in share], dtype=np.int64)
        self._frac = [s % _Q for s in share]
        self.extra = sum(self._frac) // _Q  # slots per step given by systematic sampling
        frac_start = np.cumsum([0, *self._frac[:-1]]).tolist()
        phase = int(round_keys((seed, _PHASE))[0]) % _Q
        # Offsets that keep both floors' arguments non-negative (they shift both alike).
        self._b_hi = [phase - int(a) + self.extra * _Q for a in frac_start]
        self._b_lo = [b - f for b, f in zip(self._b_hi, self._frac, strict=True)]
        self.weights = w / w.sum()

    @property
    def num_datasets(self) -> int:
        return len(self.plans)

    # -- how many of each dataset ------------------------------------------------------------
    def samples_before(self, step: int) -> np.ndarray:
        """C_d(step): samples each dataset gave to steps [0, step), in O(datasets log)."""
        out = self.base * step
        for d in range(self.num_datasets):
            if self._frac[d]:
                out[d] += floor_sum(step, _Q, _PHI, self._b_hi[d]) - floor_sum(
                    step, _Q, _PHI, self._b_lo[d]
                )
        return out

    def _counts(self, steps: np.ndarray) -> np.ndarray:
        """(len(steps), datasets): samples of each dataset in each step."""
        k = np.asarray(steps, dtype=np.int64)[:, None]
        hi = np.asarray(self._b_hi, dtype=np.int64)[None]
        lo = np.asarray(self._b_lo, dtype=np.int64)[None]
        x = (k * _PHI) % _Q  # keep the products far from int64's range at any step
        extra = (x + hi) // _Q - (x + lo) // _Q
        return self.base[None] + extra

    # -- the slots of one step -----------------------------------------------------------------
    def _slot_ids(
        self, steps: np.ndarray, slots: np.ndarray, before: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(global ids, per-sample epoch of its dataset, dataset), each (len(steps), len(slots)),
        at positions `slots` of each of `steps`, given each step's samples of every dataset
        before it and in it ((len(steps), datasets) each). One pass for all the steps: a keyed
        slot order per step, then one plan lookup per dataset and epoch."""
        G, P = self.global_batch_size, len(slots)
        keys = np.stack([round_keys((self.seed, s, _SLOTS)) for s in steps.tolist()], axis=1)
        j = index_shuffle(np.tile(slots, len(steps)), G, np.repeat(keys, P, axis=1))
        j = j.reshape(len(steps), P)  # keyed slot order
        ends = np.cumsum(counts, axis=1)
        dataset = (j[:, :, None] >= ends[:, None, :]).sum(axis=2)
        row = np.arange(len(steps))[:, None]
        stream = before[row, dataset] + j - (ends[row, dataset] - counts[row, dataset])
        ids = np.empty(j.shape, np.int64)
        epochs = np.empty(j.shape, np.int64)
        for d in np.unique(dataset).tolist():
            plan, mine = self.plans[d], dataset == d
            epoch, pos = np.divmod(stream[mine], plan.num_samples)
            got, got_epoch = np.empty(len(pos), np.int64), epoch
            for e in np.unique(epoch).tolist():
                got[epoch == e] = plan.ids_at(e, pos[epoch == e]) + self.offsets[d]
            ids[mine], epochs[mine] = got, got_epoch
        return ids, epochs, dataset

    def _per_rank(self, world_size: int) -> int:
        if self.global_batch_size % world_size:
            raise ValueError(
                f"global batch {self.global_batch_size} is not divisible by world size {world_size}"
            )
        return self.global_batch_size // world_size

    def iter_rank_work(
        self, start_step: int, end_step: int, rank: int, world_size: int, steps_at_once: int = 64
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(global ids, epoch of each in its dataset) rank `rank` reads at each step of
        [start_step, end_step); nothing before `start_step` is computed but one `floor_sum`."""
        per_rank = self._per_rank(world_size)
        slots = rank * per_rank + np.arange(per_rank)
        before = self.samples_before(start_step)
        for first in range(start_step, end_step, steps_at_once):
            steps = np.arange(first, min(end_step, first + steps_at_once))
            counts = self._counts(steps)
            befores = before + np.cumsum(counts, axis=0) - counts
            ids, epochs, _ = self._slot_ids(steps, slots, befores, counts)
            yield from zip(ids, epochs, strict=True)
            before = befores[-1] + counts[-1]

    def window_groups(self, start_step: int, end_step: int, rank: int, world_size: int):
        raise NotImplementedError("mixture read tasks are cut by size (shuffle_window = 0)")

    def global_batch(self, step: int) -> np.ndarray:
        return self.rank_slice(step, 0, 1)

    def rank_slice(self, step: int, rank: int, world_size: int) -> np.ndarray:
        ids, _ = next(self.iter_rank_work(step, step + 1, rank, world_size))
        return ids

    def global_batch_datasets(self, step: int) -> np.ndarray:
        """The dataset of each slot of step `step` (tests and tools)."""
        G = self.global_batch_size
        steps = np.array([step])
        before = self.samples_before(step)[None]
        return self._slot_ids(steps, np.arange(G), before, self._counts(steps))[2][0]

    def rank_work(self, start_step: int, end_step: int, rank: int, world_size: int) -> np.ndarray:
        parts = [ids for ids, _ in self.iter_rank_work(start_step, end_step, rank, world_size)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def cursor_at(self, step: int) -> Cursor:
        """A mixture is one endless stream (each dataset cycles its own epochs): epoch 0, and
        the samples drawn so far."""
        return Cursor(0, step * self.global_batch_size)

    def first_ids(self, n: int) -> np.ndarray:
        """The first `n` training ids of the first dataset (tools and benchmarks)."""
        return self.plans[0].first_ids(n) + self.offsets[0]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.plans) + self.offsets.nbytes + self.base.nbytes
