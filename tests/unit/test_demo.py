"""The demo dataset writer: LeRobot's schema, the simulator's content, and no overwrites."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.data.__main__ import main
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot import LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.video import decode_frames
from raytrain_vla.sim import simulator as sim

NUM_EPISODES, SEED = 20, 3
KEY = "observation.image"
PARQUETS = ("meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet")
PARQUETS += ("data/chunk-000/file-000.parquet",)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "ds", NUM_EPISODES, seed=SEED)


@pytest.fixture(scope="module")
def episodes():
    rng = np.random.default_rng(SEED)
    return [sim.rollout_expert(rng, 32) for _ in range(NUM_EPISODES)]


@pytest.mark.parametrize("name", PARQUETS)
def test_parquet_schema_matches_lerobot_fixture(demo, name):
    want = pq.read_schema(fixtures_root() / "lerobot_v3" / "pusht_like" / name)
    got = pq.read_schema(demo / name)
    assert got.names == want.names
    for field in want:
        assert got.field(field.name).type == field.type, field.name
    assert set(got.metadata or {}) == set(want.metadata or {})


def test_info_and_stats_match_lerobot_layout(demo):
    fixture = fixtures_root() / "lerobot_v3" / "pusht_like" / "meta"
    want_info = json.loads((fixture / "info.json").read_text())
    info = json.loads((demo / "meta/info.json").read_text())
    assert list(info) == list(want_info)
    assert list(info["features"]) == list(want_info["features"])
    assert set(info["features"][KEY]["info"]) == set(want_info["features"][KEY]["info"])
    assert info["features"][KEY]["info"]["video.codec"] == "h264"
    want_stats = json.loads((fixture / "stats.json").read_text())
    stats = json.loads((demo / "meta/stats.json").read_text())
    assert set(stats) == set(want_stats)
    for key, per in want_stats.items():
        assert set(stats[key]) == set(per), key
        for stat, value in per.items():
            assert np.shape(stats[key][stat]) == np.shape(value), (key, stat)


def test_metadata_and_frames_match_simulator(demo, episodes):
    meta = LeRobotMeta.load(demo)
    lengths = [len(e.states) for e in episodes]
    assert meta.num_episodes == NUM_EPISODES and meta.total_frames == sum(lengths)
    np.testing.assert_array_equal(meta.episode_length, lengths)
    assert meta.camera_keys == meta.video_keys == [KEY]
    assert meta.camera_shape(KEY) == (3, 32, 32)
    assert set(meta.tasks) == {e.scene.instruction for e in episodes}
    assert [meta.episode_tasks(i)[0] for i in range(NUM_EPISODES)] == [
        e.scene.instruction for e in episodes
    ]
    table = read_frames_table(meta, ["observation.state", "action", "timestamp", "task_index"])
    np.testing.assert_array_equal(
        to_numpy(table["action"]), np.concatenate([e.actions for e in episodes])
    )
    np.testing.assert_array_equal(
        to_numpy(table["observation.state"]), np.concatenate([e.states for e in episodes])
    )
    tasks = to_numpy(table["task_index"])
    starts = meta.episode_from_index
    assert [meta.tasks[tasks[s]] for s in starts] == [e.scene.instruction for e in episodes]
    stats_mean = meta.stats["action"]["mean"]
    np.testing.assert_allclose(stats_mean, to_numpy(table["action"]).mean(0), atol=1e-6)


def test_decoded_video_matches_rendered_frames(demo, episodes):
    meta = LeRobotMeta.load(demo)
    errs = []
    for e in (0, 7, NUM_EPISODES - 1):
        frame_ts = np.arange(meta.episode_length[e]) / meta.fps
        ts = meta.video_from_timestamp(KEY, e) + frame_ts
        got = decode_frames(meta.video_file(KEY, e), ts, tolerance_s=1e-4)
        errs.append(np.abs(got.astype(np.int16) - episodes[e].images))
    err = np.concatenate([x.reshape(-1) for x in errs])
    assert err.mean() < 4.0 and np.median(err) <= 2


def test_refuses_to_overwrite(demo):
    before = sorted(p.relative_to(demo) for p in demo.rglob("*"))
    with pytest.raises(FileExistsError, match=str(demo)):
        write_demo_dataset(demo, 2)
    assert sorted(p.relative_to(demo) for p in demo.rglob("*")) == before
    assert [p.name for p in demo.parent.iterdir()] == [demo.name]  # no temp dirs left


def test_writes_into_empty_dir_and_cli(tmp_path, capsys):
    root = tmp_path / "empty"
    root.mkdir()
    assert main(["demo", str(root), "--episodes", "2", "--seed", "1"]) == 0
    assert LeRobotMeta.load(root).num_episodes == 2
    assert main(["inspect", str(root)]) == 0
    assert "episodes: 2" in capsys.readouterr().out
    assert main(["demo", str(root), "--episodes", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(root) in err and "\n" not in err
