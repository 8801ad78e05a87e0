"""What a read task is sent stays small whatever the dataset size, and reads what it names."""

import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.data.formats.lerobot import LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.row_groups import cache_stats, read_rows
from raytrain_vla.data.plan import SamplePlan, cut_tasks, read_tasks
from raytrain_vla.data.synthetic_index import synthetic_meta


def _reader_bytes(frames: int) -> int:
    meta = synthetic_meta(frames, episodes=frames // 200)
    source = LeRobotSource(meta, chunk_size=50, checked_files=False)
    every_tenth_episode = meta.episode_from_index[::10][:64] + 3
    return len(pickle.dumps(source.reader(every_tenth_episode)))


def test_a_read_task_carries_its_samples_not_the_dataset():
    """The previous source pickled every frame's columns into every task (~100 bytes a frame):
    a 64-sample read of a 2M-frame index would be ~200 MB. Now it is a few KB either way."""
    small, large = _reader_bytes(200_000), _reader_bytes(2_000_000)
    assert large < 16_000, large
    assert large / small < 1.2, (small, large)


def test_a_read_task_reads_the_same_after_pickling():
    meta = LeRobotMeta.load(fixtures_root() / "lerobot_v3" / "pusht_like")
    source = LeRobotSource(meta, chunk_size=10)
    ids = np.array([119, 0, 41, 39, 80, 41])
    direct = source.read(ids)
    shipped = pickle.loads(pickle.dumps(source.reader(ids))).read()
    assert list(direct) == list(shipped)
    for key in direct:
        np.testing.assert_array_equal(direct[key], shipped[key])
    assert list(shipped["task"]) == [meta.tasks[i] for i in shipped["task_index"]]


def test_rows_read_by_row_group_equal_the_whole_table():
    path = next((fixtures_root() / "lerobot_v3" / "pusht_like" / "data").rglob("*.parquet"))
    assert pq.ParquetFile(path).metadata.num_row_groups > 1  # the point of the test
    table = pq.read_table(path, columns=["action", "timestamp"])
    rows = np.random.default_rng(0).integers(0, table.num_rows, 50)  # any order, repeats
    got = read_rows(str(path), rows, ["action", "timestamp"])
    np.testing.assert_array_equal(got["action"], np.stack(table["action"].to_numpy(False))[rows])
    np.testing.assert_array_equal(got["timestamp"], table["timestamp"].to_numpy()[rows])
    hits = cache_stats()["hits"]
    read_rows(str(path), rows, ["action", "timestamp"])
    assert cache_stats()["hits"] > hits  # the second read comes from the process cache


@pytest.mark.parametrize("micro, per_task", [(1, 5), (4, 512), (3, 10), (8, 8)])
def test_tasks_cut_step_by_step_equal_tasks_cut_from_the_whole_work(micro, per_task):
    lengths = np.array([40, 55, 61, 23, 77, 90])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=2, global_batch_size=24)
    work = plan.rank_work(3, 40, rank=1, world_size=2)
    epochs = plan.rank_work_epochs(3, 40, world_size=2)
    lazy = list(cut_tasks(plan.iter_rank_work(3, 40, 1, 2), per_task, micro))
    whole = read_tasks(work, per_task, micro)
    assert len(lazy) == len(whole)
    for (ids, ep), want, want_ep in zip(
        lazy, whole, read_tasks(epochs, per_task, micro), strict=True
    ):
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(ep, want_ep)


@pytest.mark.parametrize("world, start", [(1, 0), (2, 0), (4, 37), (8, 5)])
def test_window_tasks_keep_the_order_and_hold_one_window_each(world, start):
    lengths = np.full(40, 50)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=1, global_batch_size=64, shuffle_window=256)
    end = start + 2 * plan.steps_per_epoch
    groups = plan.window_groups(start, end, 0, world)
    tasks = list(cut_tasks(plan.iter_rank_work(start, end, 0, world), 10_000, 4, groups))
    np.testing.assert_array_equal(
        np.concatenate([ids for ids, _ in tasks]), plan.rank_work(start, end, 0, world)
    )
    for ids, epochs in tasks:
        assert len(set(epochs.tolist())) == 1
        perm = plan.permutation(int(epochs[0]))
        windows = {int(np.flatnonzero(perm == i)[0]) // 256 for i in ids}
        assert len(windows) <= 2  # a rank slice can straddle a window edge, nothing more
    per_window = 256 // world
    assert max(len(ids) for ids, _ in tasks) <= per_window + 64 // world


def test_a_read_task_is_capped_by_its_decoded_bytes():
    from raytrain_vla.config import load_config
    from raytrain_vla.data.spec import DataSpec
    from raytrain_vla.train.inputs import samples_per_task

    spec = DataSpec(camera_shapes={"a": (3, 480, 640), "b": (3, 480, 640)}, state_dim=6,
                    action_dim=6, chunk_size=8)  # fmt: skip
    cfg = load_config(None, ["--data.read_task_max_mb=100", "--train.micro_batch_size=8"])
    n = samples_per_task(cfg, spec)
    assert n % 8 == 0 and n * 2 * 3 * 480 * 640 <= 100 * 2**20 < (n + 8) * 2 * 3 * 480 * 640
    small = DataSpec(camera_shapes={"a": (3, 96, 96)}, state_dim=6, action_dim=6, chunk_size=8)
    assert samples_per_task(cfg, small) == cfg.data.samples_per_read_task
