"""What a read task is sent stays small whatever the dataset size, and reads what it names."""

import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.data.formats.lerobot import LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.row_groups import cache_stats, read_rows
from raytrain_vla.data.plan import SamplePlan
from raytrain_vla.data.read_tasks import cut_tasks, rank_read_tasks, read_tasks
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


def test_files_of_their_own_cost_a_task_numbers_not_path_strings():
    """64 samples from 64 episodes whose videos are separate files, vs 64 from one episode:
    the files are sent as a path pattern and a few numbers each (`CompactPaths`), so a task of
    scattered samples is not several times the bytes of a task of one episode."""
    meta = synthetic_meta(2_000_000, episodes=10_000, tasks=1)
    source = LeRobotSource(meta, chunk_size=50, checked_files=False)
    scattered = meta.episode_from_index[::100][:64] + 3
    together = meta.episode_from_index[5000] + np.arange(64)
    read = source.reader(scattered)
    assert len(read.videos[source.camera_keys[0]].paths) == 64  # one file each
    assert list(read.videos[source.camera_keys[0]].paths) == [
        source.video_paths[source.camera_keys[0]][f]
        for f in source.video_file_of_episode[source.camera_keys[0]][read.episodes]
    ]
    many, one = len(pickle.dumps(read)), len(pickle.dumps(source.reader(together)))
    assert many - one < 64 * 40, (one, many)  # a path string alone is ~60 bytes


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


@pytest.mark.parametrize("world, start", [(1, 0), (2, 0), (4, 37), (8, 5), (32, 11)])
@pytest.mark.parametrize("cap", [128, 32])
def test_window_tasks_keep_the_order_and_pack_whole_windows(world, start, cap):
    """Tasks hold whole (epoch, window) groups packed up to the cap: a group is split only when
    it alone exceeds the cap, a task never spans two epochs, and a task ends early only where
    the next group would not fit. Large worlds (a few samples of a window per rank) thus get
    full tasks, not one tiny task per window."""
    lengths = np.full(40, 50)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=1, global_batch_size=64, shuffle_window=256)
    end = start + 2 * plan.steps_per_epoch
    tasks = list(rank_read_tasks(plan, start, end, 0, world, cap, 2))
    np.testing.assert_array_equal(
        np.concatenate([ids for ids, _ in tasks]), plan.rank_work(start, end, 0, world)
    )
    per_rank = 64 // world
    keys = list(plan.window_groups(start, end, 0, world))
    group_of_sample = np.repeat(np.unique(keys, axis=0, return_inverse=True)[1], per_rank)
    group_size = np.bincount(group_of_sample)
    task_of_sample = np.repeat(np.arange(len(tasks)), [len(ids) for ids, _ in tasks])
    for g in np.unique(group_of_sample):
        holders = np.unique(task_of_sample[group_of_sample == g])
        assert len(holders) == 1 or group_size[g] > cap
    at = 0
    for t, (ids, epochs) in enumerate(tasks):
        assert len(ids) <= cap and len(set(epochs.tolist())) == 1
        at += len(ids)
        if t + 1 < len(tasks) and tasks[t + 1][1][0] == epochs[0] and group_size.max() <= cap:
            next_group = group_of_sample[at]  # the next task starts with a whole group
            assert len(ids) + group_size[next_group] > cap
    if world == 32 and cap == 128:  # 2 samples of each window per rank, 62 an epoch: one
        assert len(tasks) == len({int(e[0]) for _, e in tasks})  # task per epoch, not per window


def test_the_next_epoch_is_computed_only_when_its_first_task_is():
    lengths = np.full(40, 50)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=1, global_batch_size=64, shuffle_window=256)
    last_steps = plan.steps_per_epoch - 3
    tasks = rank_read_tasks(plan, last_steps, 2 * plan.steps_per_epoch, 0, 2, 10_000, 2)
    ids, epochs = next(tasks)
    assert set(epochs.tolist()) == {0} and len(ids) == 3 * 32
    assert plan._epoch_blocks[0] == 0  # epoch 1's order not computed yet
    assert set(next(tasks)[1].tolist()) == {1}


def test_a_read_task_is_capped_by_its_decoded_bytes():
    from raytrain_vla.common.spec import DataSpec
    from raytrain_vla.config import load_config
    from raytrain_vla.train.inputs import samples_per_task

    spec = DataSpec(camera_shapes={"a": (3, 480, 640), "b": (3, 480, 640)}, state_dim=6,
                    action_dim=6, chunk_size=8)  # fmt: skip
    cfg = load_config(None, ["--data.read_task_max_mb=100", "--train.micro_batch_size=8"])
    n = samples_per_task(cfg, spec)
    assert n % 8 == 0 and n * 2 * 3 * 480 * 640 <= 100 * 2**20 < (n + 8) * 2 * 3 * 480 * 640
    small = DataSpec(camera_shapes={"a": (3, 96, 96)}, state_dim=6, action_dim=6, chunk_size=8)
    assert samples_per_task(cfg, small) == cfg.data.samples_per_read_task


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
@pytest.mark.parametrize("size", [(40, 56), (128, 128)])
def test_frames_resized_while_decoding_equal_frames_resized_after(name, size, tmp_path):
    """A processor's `frame_size` lets a task resize each frame as it is decoded (video) or
    read (image features, shards); the pixels are exactly those of resizing the whole read."""
    from raytrain_vla.common.image_ops import resize_images
    from raytrain_vla.data.formats.shards import ShardSource, convert_to_shards

    root = fixtures_root() / "lerobot_v3" / name
    source = LeRobotSource(LeRobotMeta.load(root), chunk_size=10)
    convert_to_shards(root, tmp_path / "shards", chunk_size=10, samples_per_shard=50,
                      use_ray=False)  # fmt: skip
    ids = np.array([119, 0, 41, 39, 80, 41])
    plain = source.read(ids)
    images = {k: v for k, v in plain.items() if k.startswith("image/")}
    assert images
    want = plain | resize_images(images, size)
    for reader in (source.reader, ShardSource(tmp_path / "shards", 10).reader):
        got = pickle.loads(pickle.dumps(reader(ids, size))).read()
        assert list(got) == list(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        empty = reader(ids[:0], size).read()
        assert all(empty[k].shape == (0, 3, *size) for k in images)


def test_a_task_holds_more_samples_when_it_resizes_while_decoding():
    from raytrain_vla.common.spec import DataSpec
    from raytrain_vla.config import load_config
    from raytrain_vla.train.inputs import samples_per_task

    cfg = load_config(None, ["--data.read_task_max_mb=256", "--train.micro_batch_size=8"])
    spec = DataSpec(
        camera_shapes={"a": (3, 480, 640), "b": (3, 480, 640)}, state_dim=6, action_dim=6,
        chunk_size=8, image_size=None,
    )  # fmt: skip
    native, resized = samples_per_task(cfg, spec), samples_per_task(cfg, spec, (224, 224))
    assert (native, resized) == (144, 888)  # 256 MiB / (2 x 480x640x3) vs / (2 x 224x224x3)


def test_the_synthetic_index_holds_every_frame_in_episodes_of_positive_length():
    """The scale benchmark's index: its last episode once took the rounding and went negative."""
    meta = synthetic_meta(1_000_000, episodes=5_000)
    length = meta.episode_length
    assert length.min() >= 1 and int(length.sum()) == meta.total_frames == 1_000_000
    np.testing.assert_array_equal(meta.episode_from_index, np.cumsum(length) - length)


def test_a_task_ends_before_the_next_groups_ids_are_computed():
    """Where a window-packed task ends follows from the window keys alone: the first task
    after a resume mid-window pulls exactly its own steps from the plan, none of the group
    that no longer fits (a look ahead that used to cost the plan a batch of steps)."""
    lengths = np.full(400, 50)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plan = SamplePlan.from_runs(starts, lengths, seed=1, global_batch_size=64, shuffle_window=256)
    pulled = []

    def counted(start, end, rank, world):
        for step in SamplePlan.iter_rank_work(plan, start, end, rank, world):
            pulled.append(step)
            yield step

    plan.iter_rank_work = counted
    tasks = rank_read_tasks(plan, 5, 2 * plan.steps_per_epoch, 0, 32, 128, 2)
    ids, _ = next(tasks)
    assert len(ids) == 126  # 3 steps left of the first window, 15 windows of 4 steps, 2 each
    assert sum(len(step) for step, _ in pulled) == len(ids)
