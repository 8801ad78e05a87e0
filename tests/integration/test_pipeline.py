"""The per-rank pipeline on the session's cluster: batches in plan order, and a loop that stops
early releases what it read."""

from __future__ import annotations

import gc
import re
import threading
import time

import numpy as np
import pytest
import ray

from raytrain_vla.data import pipeline
from raytrain_vla.data.formats.lerobot import LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.pipeline import _segment_batches, iter_rank_batches
from raytrain_vla.data.plan import SamplePlan
from raytrain_vla.data.read_tasks import rank_read_tasks

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _plasma_mib() -> int:
    from ray._private.internal_api import memory_summary

    text = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
    return int(re.search(r"Plasma memory usage (\d+) MiB", text).group(1))


@pytest.mark.parametrize("micro", [1, 3, 8, 13])
def test_segment_batches_equal_ray_datas_own_batching(micro):
    """Blocks of uneven sizes (so batches straddle blocks), a tensor and a string column."""
    sizes = [5, 11, 1, 16, 7]
    items = [
        {"sample_id": i, "image": np.full((2, 3), i, np.uint8), "task": f"task {i % 3}"}
        for i in range(sum(sizes))
    ]
    ds = ray.data.from_items(items, override_num_blocks=len(sizes)).materialize()
    want = list(ds.iter_batches(batch_size=micro, batch_format="numpy"))
    got = list(_segment_batches(ds, micro))
    assert [len(b["sample_id"]) for b in got] == [len(b["sample_id"]) for b in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key in w:
            assert g[key].dtype == w[key].dtype, key
            np.testing.assert_array_equal(g[key], w[key], err_msg=key)


def test_a_loop_that_stops_early_leaves_no_thread_and_no_blocks_behind(demo_root):
    """Ray Data's `iter_batches` kept a prefetch thread and its blocks for every iterator left
    before its end; ten early stops then held ten segments in the object store."""
    meta = LeRobotMeta.load(demo_root)
    source = LeRobotSource(meta, 8)
    plan = SamplePlan.from_runs(meta.episode_from_index, meta.episode_length, 0, 32, 8, 256)
    want = plan.rank_work(0, 2, 0, 1)
    first = next(iter_rank_batches(source, rank_read_tasks(plan, 0, 2, 0, 1, 64, 16), 16))
    np.testing.assert_array_equal(first["sample_id"], want[:16])
    gc.collect()
    time.sleep(1)
    threads, plasma = threading.active_count(), _plasma_mib()
    for _ in range(10):
        tasks = rank_read_tasks(plan, 0, plan.steps_per_epoch, 0, 1, 256, 16)
        for batch in iter_rank_batches(source, tasks, 16, tasks_per_segment=2):
            np.testing.assert_array_equal(batch["sample_id"], want[:16])
            break
    gc.collect()
    assert threading.active_count() == threads, [t.name for t in threading.enumerate()]
    deadline = time.monotonic() + 20  # the object store frees released blocks asynchronously
    while _plasma_mib() > plasma + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _plasma_mib() <= plasma + 1


def test_the_first_segment_is_one_small_task_and_the_order_is_unchanged(demo_root, monkeypatch):
    """The stream's first task is cut to 1/8 and decoded alone, so the first batch waits for a
    small decode rather than a whole segment; the first full segment decodes beside it (the
    lead waits here until that one has started, and would time out otherwise); the samples
    arrive in the plan's order. With `lead_fraction=1` the first segment is a full one."""
    meta = LeRobotMeta.load(demo_root)
    source = LeRobotSource(meta, 8)
    plan = SamplePlan.from_runs(meta.episode_from_index, meta.episode_length, 0, 32, 8, 256)
    segments, beside, waits_for_second = [], [], True
    second_started = threading.Event()
    materialize = pipeline._materialize

    def recorded(source, tasks, *args):
        segments.append([len(ids) for ids, _ in tasks])
        if len(segments) == 1 and waits_for_second:
            beside.append(second_started.wait(timeout=60))
        else:
            second_started.set()
        return materialize(source, tasks, *args)

    monkeypatch.setattr(pipeline, "_materialize", recorded)
    for lead_fraction, want_segments, want_beside in [
        (8, [[32], [224, 256]], [True]),
        (1, [[256, 256]], []),
    ]:
        segments.clear()
        beside.clear()
        second_started.clear()
        waits_for_second = lead_fraction > 1
        tasks = rank_read_tasks(plan, 0, 16, 0, 1, 256, 16)
        batches = list(
            iter_rank_batches(source, tasks, 16, tasks_per_segment=2, lead_fraction=lead_fraction)
        )
        assert all(len(b["sample_id"]) == 16 for b in batches)
        got = np.concatenate([b["sample_id"] for b in batches])
        np.testing.assert_array_equal(got, plan.rank_work(0, 16, 0, 1))
        assert segments == want_segments  # windows of 256 samples; the first one's 1/8 alone
        assert beside == want_beside
