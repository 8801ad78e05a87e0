"""LeRobot v3.0 metadata and frame table, on fixtures written by LeRobot itself."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta, read_frames_table

EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
TASKS = ["push the T to the green target", "push the T to the left", "push the T to the right"]


@pytest.fixture
def pusht_copy(tmp_path):
    """A writable copy of the video fixture, to corrupt."""
    dst = tmp_path / "pusht_like"
    shutil.copytree(fixtures_root() / "lerobot_v3" / "pusht_like", dst)
    return dst


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
def test_loads_fixture(name):
    meta = LeRobotMeta.load(fixtures_root() / "lerobot_v3" / name)
    assert (meta.version, meta.fps, meta.num_episodes, meta.total_frames) == ("v3.0", 10, 3, 120)
    assert meta.camera_keys == ["observation.image"]
    assert meta.camera_shape("observation.image") == (3, 64, 64)
    assert (meta.state_dim, meta.action_dim) == (2, 2)
    assert meta.tasks == TASKS
    assert [meta.episode_tasks(e) for e in range(3)] == [[t] for t in TASKS]
    np.testing.assert_array_equal(meta.episode_index, [0, 1, 2])
    np.testing.assert_array_equal(meta.episode_length, [40, 40, 40])
    np.testing.assert_array_equal(meta.episode_from_index, [0, 40, 80])
    np.testing.assert_array_equal(meta.episode_to_index, [40, 80, 120])
    assert meta.data_file(2).is_file()
    assert meta.stats["observation.image"]["mean"].shape == (3, 1, 1)
    assert meta.stats["action"]["q99"].shape == (2,)
    if name == "pusht_like":
        assert (meta.video_keys, meta.image_keys) == (["observation.image"], [])
        assert [meta.video_from_timestamp("observation.image", e) for e in range(3)] == [0, 4, 8]
        assert meta.video_file("observation.image", 1).is_file()
    else:
        assert (meta.video_keys, meta.image_keys) == ([], ["observation.image"])


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
def test_frames_table_matches_lerobot_items(name):
    root = fixtures_root() / "lerobot_v3"
    meta = LeRobotMeta.load(root / name)
    cols = ["observation.state", "action", "timestamp", "episode_index", "task_index"]
    table = read_frames_table(meta, cols + meta.image_keys)
    assert table.num_rows == 120
    np.testing.assert_array_equal(to_numpy(table["index"]), np.arange(120))
    action, state = to_numpy(table["action"]), to_numpy(table["observation.state"])
    assert action.shape == (120, 2) and action.dtype == np.float32
    ref = np.load(root / f"{name}_reference.npz")
    for i in (0, 41, 119):
        np.testing.assert_array_equal(state[i], ref[f"idx{i}/observation.state"][1])
        np.testing.assert_array_equal(action[i], ref[f"idx{i}/action"][0])
        assert to_numpy(table["task_index"])[i] == ref[f"idx{i}/task_index"]


def test_corrupt_info_json_names_file(pusht_copy):
    (pusht_copy / "meta/info.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"meta/info\.json"):
        LeRobotMeta.load(pusht_copy)


def test_missing_info_and_keys_name_file(pusht_copy, tmp_path):
    with pytest.raises(DatasetError, match=r"info\.json.*missing"):
        LeRobotMeta.load(tmp_path / "nowhere")
    info = json.loads((pusht_copy / "meta/info.json").read_text())
    del info["fps"]
    (pusht_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"info\.json.*'fps'"):
        LeRobotMeta.load(pusht_copy)


def test_unsupported_version_is_refused(pusht_copy):
    info = json.loads((pusht_copy / "meta/info.json").read_text())
    info["codebase_version"] = "v1.6"
    (pusht_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="v1.6"):
        LeRobotMeta.load(pusht_copy)


def test_corrupt_episodes_file_names_file(pusht_copy):
    (pusht_copy / EPISODES_FILE).write_bytes(b"garbage")
    with pytest.raises(DatasetError, match=r"episodes/chunk-000/file-000\.parquet"):
        LeRobotMeta.load(pusht_copy)


def test_episode_length_mismatch_names_episode(pusht_copy):
    path = pusht_copy / EPISODES_FILE
    table = pq.read_table(path)
    lengths = table["length"].to_numpy().copy()
    lengths[1] = 39
    table = table.set_column(table.schema.get_field_index("length"), "length", pa.array(lengths))
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match="episode 1 has length 39"):
        LeRobotMeta.load(pusht_copy)


def test_shape_disagreeing_with_info_names_file_and_column(pusht_copy):
    info = json.loads((pusht_copy / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [3]
    (pusht_copy / "meta/info.json").write_text(json.dumps(info))
    meta = LeRobotMeta.load(pusht_copy)
    with pytest.raises(DatasetError, match=r"file-000\.parquet: column 'action'.*\[3\]"):
        read_frames_table(meta, ["action"])


def test_gap_in_index_column_names_file(pusht_copy):
    path = pusht_copy / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    index = table["index"].to_numpy().copy()
    index[50:] += 1
    table = table.set_column(table.schema.get_field_index("index"), "index", pa.array(index))
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match=r"file-000\.parquet: column 'index' is not contiguous"):
        read_frames_table(LeRobotMeta.load(pusht_copy), ["action"])


def test_nan_in_actions_is_refused(pusht_copy):
    path = pusht_copy / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    action = to_numpy(table["action"]).copy()
    action[7, 1] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), 2)
    table = table.set_column(table.schema.get_field_index("action"), "action", col)
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match="'action' contains NaN"):
        read_frames_table(LeRobotMeta.load(pusht_copy), ["action"])
