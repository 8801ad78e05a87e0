"""The sample plan is a pure function of (samples, seed, epoch, G): never of the world size."""

import numpy as np
import pytest

from raytrain_vla.data.index_shuffle import index_shuffle, index_unshuffle
from raytrain_vla.data.plan import BLOCK, GROUP, Cursor, SamplePlan, Spans, runs_of


def _dataset(lengths=(13, 7, 20, 1, 16, 33)):
    episode_of = np.concatenate([np.full(n, e) for e, n in enumerate(lengths)])
    return np.arange(len(episode_of)), episode_of


def build_spans(ids, ep, span_len):
    return Spans(*runs_of(ids, ep), span_len).all()


def test_spans_stay_in_one_episode_and_cover_every_sample():
    ids, ep = _dataset()
    spans = build_spans(ids, ep, span_len=8)
    assert np.array_equal(np.sort(np.concatenate(spans)), ids)
    for span in spans:
        assert len(span) <= 8
        assert len(set(ep[span])) == 1
        assert np.all(np.diff(span) == 1)


def test_spans_break_at_gaps_from_held_out_episodes():
    ids, ep = _dataset()
    keep = ep != 2
    spans = build_spans(ids[keep], ep[keep], span_len=100)
    assert all(len(set(ep[s])) == 1 for s in spans)
    assert np.array_equal(np.sort(np.concatenate(spans)), ids[keep])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_index_shuffle_is_a_keyed_bijection(n):
    perm = index_shuffle(np.arange(n), n, (3, 1))
    assert np.array_equal(np.sort(perm), np.arange(n))
    some = np.arange(0, n, 3)
    assert np.array_equal(index_shuffle(some, n, (3, 1)), perm[some])  # pointwise = whole
    if n > 3:
        assert not np.array_equal(perm, index_shuffle(np.arange(n), n, (3, 2)))
        assert not np.array_equal(perm, np.arange(n))


def test_index_shuffle_is_uniform():
    """Each of 5 values lands at each position with probability 1/5 over keys."""
    counts = np.zeros((5, 5))
    for key in range(1500):
        counts[np.arange(5), index_shuffle(np.arange(5), 5, (key,))] += 1
    expected = 1500 / 5
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)  # ~5 sigma


@pytest.mark.parametrize("window", [1, 5, 64])
def test_permutation_is_a_deterministic_permutation(window):
    ids, ep = _dataset()

    def perm(seed, epoch):
        return SamplePlan(ids, ep, seed, 10, span_len=4, shuffle_window=window).permutation(epoch)

    p1 = perm(3, 1)
    assert np.array_equal(p1, perm(3, 1))
    assert np.array_equal(np.sort(p1), ids)
    assert not np.array_equal(p1, perm(3, 2))
    assert not np.array_equal(p1, perm(4, 1))


def test_without_a_window_shuffle_spans_stay_whole():
    ids, ep = _dataset()
    order = SamplePlan(ids, ep, 0, 10, span_len=4, shuffle_window=1).permutation(0)
    runs = np.split(order, np.flatnonzero(np.diff(order) != 1) + 1)
    spans = {tuple(s) for s in build_spans(ids, ep, 4)}
    for run in runs:  # each run of consecutive ids is one or more whole spans
        pieces = build_spans(run, ep[run], 4)
        assert all(tuple(p) in spans for p in pieces)


def test_a_plan_from_runs_equals_the_plan_from_ids():
    ids, ep = _dataset()
    keep = ep != 2
    a = SamplePlan(ids[keep], ep[keep], 7, 8, span_len=3, shuffle_window=10)
    starts, lengths = runs_of(ids[keep], ep[keep])
    b = SamplePlan.from_runs(starts, lengths, 7, 8, span_len=3, shuffle_window=10)
    for epoch in range(2):
        assert np.array_equal(a.permutation(epoch), b.permutation(epoch))


def test_the_plan_never_holds_an_epoch():
    """10M samples: a late step's rank slice costs O(runs + spans / BLOCK) bytes, not O(N)."""
    lengths = np.full(40_000, 250)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=0, global_batch_size=1024)
    step = 3 * plan.steps_per_epoch + int(0.9 * plan.steps_per_epoch)
    ids = plan.rank_slice(step, rank=200, world_size=256)
    assert len(ids) == 4 and len(set(ids.tolist())) == 4
    per_sample_array = plan.num_samples * 8
    assert plan.nbytes < per_sample_array / 40
    assert plan.spans.nbytes <= 2.5 * len(lengths)  # uint16 lengths, a bit, an anchor per GROUP
    spans = plan.spans.count
    assert plan.nbytes < plan.spans.nbytes + spans // BLOCK * 8 + 16 * (BLOCK * 16 + 64)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 8])
def test_global_batches_do_not_depend_on_world_size(world_size):
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=0, global_batch_size=24, span_len=4, shuffle_window=16)
    for step in range(3 * plan.steps_per_epoch + 1):
        parts = [plan.rank_slice(step, r, world_size) for r in range(world_size)]
        assert np.array_equal(np.concatenate(parts), plan.global_batch(step))
        assert len({len(p) for p in parts}) == 1


def test_each_epoch_reads_each_sample_at_most_once():
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=0, global_batch_size=10)
    for epoch in range(3):
        steps = range(epoch * plan.steps_per_epoch, (epoch + 1) * plan.steps_per_epoch)
        seen = np.concatenate([plan.global_batch(s) for s in steps])
        assert len(seen) == len(set(seen.tolist())) == plan.steps_per_epoch * 10


def test_rank_work_from_a_cursor_equals_the_tail_of_the_full_work():
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=1, global_batch_size=12)
    full = plan.rank_work(0, 40, rank=1, world_size=3)
    tail = plan.rank_work(17, 40, rank=1, world_size=3)
    assert np.array_equal(full[17 * 4 :], tail)


def test_cursor_round_trip():
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=1, global_batch_size=12)
    for step in range(0, 50, 7):
        cursor = plan.cursor_at(step)
        assert plan.step_of(Cursor.from_dict(cursor.to_dict())) == step
        assert cursor.sample_in_epoch < plan.steps_per_epoch * 12


def test_uneven_world_size_is_an_error():
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=0, global_batch_size=10)
    with pytest.raises(ValueError, match="not divisible"):
        plan.rank_slice(0, 0, 3)


def test_too_few_samples_is_an_error():
    ids, ep = _dataset((3,))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        SamplePlan(ids, ep, seed=0, global_batch_size=10)


GLOBAL_BATCH = 168  # 2^3 * 3 * 7: divisible by W = 1..8 and several micro-batch sizes
VALID_LAYOUTS = [(w, m) for w in range(1, 9) for m in (1, 2, 3) if GLOBAL_BATCH % (w * m) == 0]


@pytest.mark.parametrize("world_size, micro_batch", VALID_LAYOUTS)
def test_rank_work_is_the_concatenated_rank_slices_for_valid_layouts(world_size, micro_batch):
    global_batch = GLOBAL_BATCH
    ids, ep = _dataset((40, 55, 61, 23, 77, 90))
    plan = SamplePlan(
        ids, ep, seed=2, global_batch_size=global_batch, span_len=5, shuffle_window=50
    )
    per_rank = global_batch // world_size
    for start in (0, 1, plan.steps_per_epoch - 1):
        works = [plan.rank_work(start, start + 2, r, world_size) for r in range(world_size)]
        for k in range(2):
            got = np.concatenate([w[k * per_rank : (k + 1) * per_rank] for w in works])
            assert np.array_equal(got, plan.global_batch(start + k))
        epochs = plan.rank_work_epochs(start, start + 2, world_size)
        assert len(epochs) == len(works[0])
        assert epochs[0] == start // plan.steps_per_epoch


def test_resuming_from_any_cursor_continues_the_exact_sequence():
    ids, ep = _dataset()
    plan = SamplePlan(ids, ep, seed=5, global_batch_size=8, span_len=3, shuffle_window=10)
    full = [plan.global_batch(s) for s in range(30)]
    for step in range(30):
        resumed = SamplePlan(ids, ep, seed=5, global_batch_size=8, span_len=3, shuffle_window=10)
        cursor = Cursor.from_dict(plan.cursor_at(step).to_dict())
        start = resumed.step_of(cursor)
        assert all(
            np.array_equal(resumed.global_batch(start + k), full[step + k])
            for k in range(30 - step)
        )


def test_first_ids_are_the_training_ids_in_order():
    ids, ep = _dataset()
    keep = ep != 1
    plan = SamplePlan(ids[keep], ep[keep], seed=0, global_batch_size=4)
    np.testing.assert_array_equal(plan.first_ids(20), ids[keep][:20])
    assert len(plan.first_ids(10_000)) == keep.sum()


def _pinned_runs(offset: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    lengths, gaps = rng.integers(20, 300, size=400), rng.integers(0, 50, size=400)
    return offset + np.cumsum(lengths + gaps) - lengths, lengths


def test_the_order_of_plan_version_2_is_pinned():
    """Checkpoints record `sample_plan` 2 and resume into this exact order, so any change to it
    (such as the run table's narrower columns) must leave these ids as plan 2 first gave them."""
    starts, lengths = _pinned_runs(70_000)
    plan = SamplePlan.from_runs(starts, lengths, seed=11, global_batch_size=64, shuffle_window=256)
    assert plan.ids_at(0, np.array([0, 1, 2, 3, 1000, 50000])).tolist() == [
        115301, 119463, 140330, 72904, 106882, 96003,
    ]  # fmt: skip
    assert plan.ids_at(3, np.array([7, 8, 9])).tolist() == [137059, 117852, 100750]
    step = 5 * plan.steps_per_epoch + 3
    assert plan.global_batch(step)[:6].tolist() == [
        132088, 131633, 130878, 130875, 107869, 130881,
    ]  # fmt: skip


@pytest.mark.parametrize("offset", [0, 2**16, 2**31 + 5])
def test_the_run_table_is_two_bytes_a_segment_and_the_order_does_not_depend_on_where_ids_start(
    offset,
):
    """Runs with gaps between them (held-out episodes) cost a length and a jump of 2 bytes each
    plus a bit and an anchor share, wherever the ids start; the plan over runs shifted by
    `offset` reads the same positions, shifted."""
    starts, lengths = _pinned_runs(0)
    base = SamplePlan.from_runs(starts, lengths, seed=3, global_batch_size=64, shuffle_window=256)
    moved = SamplePlan.from_runs(starts + offset, lengths, seed=3, global_batch_size=64,
                                 shuffle_window=256)  # fmt: skip
    table = moved.spans
    assert table.segment_length.dtype == np.uint16
    segments = table.num_segments
    assert 400 < segments <= 800
    assert (
        table.nbytes
        == base.spans.nbytes
        <= 2 * segments + segments / 8 + 8 * (segments / GROUP + 1)
    )
    positions = np.arange(0, base.num_samples, 37)
    for epoch in (0, 2):
        got = moved.ids_at(epoch, positions)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, base.ids_at(epoch, positions) + offset)
    assert base.first_ids(500).tolist() == (moved.first_ids(500) - offset).tolist()


def _dense_spans(starts, lengths, span_len):
    return [
        (int(s) + k, min(span_len, int(n) - k))
        for s, n in zip(starts, lengths, strict=True)
        for k in range(0, int(n), span_len)
    ]


@pytest.mark.parametrize(
    "layout", ["ascending", "shuffled", "long runs", "far jumps", "empty runs"]
)
def test_the_compact_run_table_gives_every_span_and_block_as_the_runs_do(layout):
    """Span bounds, the runs read back in order and the per-epoch block ends equal those
    computed directly from (first id, length) lists: runs in any order (jumps back), runs
    longer than 2 bytes hold, jumps wider than that, runs of length 0."""
    rng = np.random.default_rng(len(layout))
    n = 700
    lengths = rng.integers(1, 40, size=n)
    if layout == "long runs":
        lengths[[100, 500]] = 65_536 + 7, 70_001
    gaps = rng.integers(0, 3, size=n) * rng.integers(1, 30, size=n)
    if layout == "far jumps":
        gaps[::97] = 2**40
    starts = np.cumsum(lengths + gaps) - lengths
    if layout == "shuffled":
        order = rng.permutation(n)
        starts, lengths = starts[order], lengths[order]
    if layout == "empty runs":
        lengths[::7] = 0
    span_len = 4
    plan = SamplePlan.from_runs(starts, lengths, seed=2, global_batch_size=64, span_len=span_len)
    dense = _dense_spans(starts[lengths > 0], lengths[lengths > 0], span_len)
    spans = plan.spans
    assert spans.count == len(dense) > 3 * BLOCK
    first, size = spans.bounds(np.arange(spans.count))
    assert list(zip(first.tolist(), size.tolist(), strict=True)) == dense
    runs = [
        np.concatenate(part)
        for part in zip(*spans.iter_runs(segments_at_once=GROUP * 3), strict=True)
    ]
    keep = lengths > 0
    np.testing.assert_array_equal(runs[0], starts[keep])
    np.testing.assert_array_equal(runs[1], lengths[keep])
    np.testing.assert_array_equal(runs[2][1:], np.cumsum(-(-lengths[keep] // span_len))[:-1])
    for epoch in (0, 3):
        keys, ends = plan._block_ends(epoch)
        _, shuffled = spans.bounds(index_shuffle(np.arange(spans.count), spans.count, keys))
        direct = np.cumsum(np.add.reduceat(shuffled, np.arange(0, spans.count, BLOCK)))
        np.testing.assert_array_equal(ends, direct)
    assert np.array_equal(np.sort(plan.permutation(1)), np.sort(np.concatenate(spans.all())))


@pytest.mark.parametrize("n", [2, 3, 100, 4097])
def test_index_unshuffle_inverts_index_shuffle(n):
    perm = index_shuffle(np.arange(n), n, (9, 4))
    np.testing.assert_array_equal(index_unshuffle(perm, n, (9, 4)), np.arange(n))
    np.testing.assert_array_equal(
        index_shuffle(index_unshuffle(np.arange(n), n, (9,)), n, (9,)), np.arange(n)
    )
