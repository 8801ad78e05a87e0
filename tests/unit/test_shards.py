"""Arrow/Parquet shards without Ray: same samples as the LeRobot source, and clear refusals."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.__main__ import main
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.shards import ShardSource, convert_to_shards

KEY = "image/observation.image"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "ds", 8, 0)


@pytest.fixture(scope="module")
def lerobot(demo):
    return LeRobotSource(LeRobotMeta.load(demo), 8)


@pytest.fixture(scope="module", params=["raw", "png"])
def shards(request, demo, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "shards"
    # Small shards and row groups so reads cross both boundaries.
    convert_to_shards(
        demo, out, image_format=request.param, samples_per_shard=25, row_group_size=8, use_ray=False
    )
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_read_matches_lerobot_source_for_random_ids(shards, lerobot):
    source = ShardSource(shards, 8)
    n = len(lerobot.episode_of)
    rng = np.random.default_rng(0)
    for size in (1, 7, 40, n):
        ids = rng.choice(n, size=size, replace=size > n // 2)  # unsorted, with repeats
        _assert_same(source.read(ids), lerobot.read(ids))
    _assert_same(source.read(np.arange(n)), lerobot.read(np.arange(n)))
    np.testing.assert_array_equal(source.episode_of, lerobot.episode_of)
    assert source.camera_keys == lerobot.camera_keys and source.chunk_size == 8
    empty = source.read(np.array([], dtype=np.int64))
    assert empty[KEY].shape == (0, 3, 32, 32) and empty["actions"].shape == (0, 8, 2)


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
def test_lerobot_written_fixtures_video_and_image_features(name, tmp_path):
    root = fixtures_root() / "lerobot_v3" / name
    want = LeRobotSource(LeRobotMeta.load(root), 8)
    ids = np.random.default_rng(1).permutation(len(want.episode_of))
    for fmt in ("raw", "png"):
        out = tmp_path / fmt
        convert_to_shards(root, out, image_format=fmt, samples_per_shard=37, use_ray=False)
        _assert_same(ShardSource(out, 8).read(ids), want.read(ids))


def test_a_read_task_pickles_small_and_reads_after_unpickling(shards, lerobot):
    ids = np.array([5, 3, 70, 0])
    blob = pickle.dumps(ShardSource(shards, 8).reader(ids))  # what a Ray Data task carries
    assert len(blob) < 4096, len(blob)
    _assert_same(pickle.loads(blob).read(), lerobot.read(ids))


def test_layout_and_manifest(shards, demo, lerobot):
    manifest = json.loads((shards / "shards.json").read_text())
    fmt = manifest["image_format"]
    n = len(lerobot.episode_of)
    assert manifest["num_samples"] == n and manifest["chunk_size"] == 8
    assert manifest["cameras"] == {"observation.image": [3, 32, 32]}
    entries = manifest["shards"]
    assert [e["file"] for e in entries] == [
        f"shards/shard-{i:05d}.parquet" for i in range(len(entries))
    ]
    assert sum(e["num_rows"] for e in entries) == n and entries[-1]["last_sample_id"] == n - 1
    table = pq.read_table(shards / entries[1]["file"])
    assert table["sample_id"].to_pylist() == list(range(25, 50))
    cols = {"sample_id", "episode_index", "frame_index", "timestamp", "task_index", "state"}
    cols |= {"actions", "action_is_pad", KEY}  # no model inputs: the processor makes those
    assert set(table.column_names) == cols and manifest["version"] == 2
    assert str(table.schema.field(KEY).type) == (
        "binary" if fmt == "png" else "fixed_size_binary[3072]"
    )
    if fmt == "png":
        assert table[KEY][0].as_py()[:8] == b"\x89PNG\r\n\x1a\n"
    assert LeRobotMeta.load(shards).total_frames == n  # the meta/ copy stands in for the source


def test_dataset_view_on_shards_matches_lerobot(shards, demo):
    views = [
        DatasetView.open(DataConfig(root=str(root), val_fraction=0.25), 1, 4)
        for root in (demo, shards)
    ]
    assert isinstance(views[1].source, ShardSource)
    assert views[0].fingerprint == views[1].fingerprint
    np.testing.assert_array_equal(views[0].val_ids, views[1].val_ids)
    for step in range(3):
        ids = views[0].plan.global_batch(step)
        np.testing.assert_array_equal(ids, views[1].plan.global_batch(step))
        _assert_same(views[1].source.read(ids), views[0].source.read(ids))


def test_version_1_shards_with_their_token_column_still_read(shards, lerobot, tmp_path):
    old = tmp_path / "v1"
    shutil.copytree(shards, old)
    manifest = json.loads((old / "shards.json").read_text())
    for entry in manifest["shards"]:  # version 1 also stored byte tokens per row
        path = old / entry["file"]
        table = pq.read_table(path)
        tokens = pa.array([[1] * 48] * table.num_rows, pa.list_(pa.int16(), 48))
        pq.write_table(table.append_column("task_tokens", tokens), path, row_group_size=8)
        del entry["bytes"]  # recorded since version 3 of the writer's entries
    (old / "shards.json").write_text(json.dumps({**manifest, "version": 1, "max_text_len": 48}))
    ids = np.random.default_rng(2).permutation(len(lerobot.episode_of))[:30]
    _assert_same(ShardSource(old, 8).read(ids), lerobot.read(ids))
    (old / "shards.json").write_text(json.dumps({**manifest, "version": 3}))
    with pytest.raises(DatasetError, match=r"shards\.json: shards format version 3, expected"):
        ShardSource(old, 8)


def test_chunk_size_mismatch_names_manifest_and_both_values(shards):
    with pytest.raises(DatasetError, match=r"shards\.json.*chunk_size 8.*chunk_size 4"):
        ShardSource(shards, 4)


def test_out_of_range_ids_are_refused(shards):
    with pytest.raises(DatasetError, match="not in 0.."):
        ShardSource(shards, 8).read(np.array([0, 10_000]))


def test_refuses_non_empty_out_and_leaves_no_temp_dir(demo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=str(out)):
        convert_to_shards(demo, out, use_ray=False)
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(DatasetError, match="image format"):
        convert_to_shards(demo, tmp_path / "x", image_format="jpeg", use_ray=False)


def test_empty_out_dir_is_accepted(demo, tmp_path):
    (tmp_path / "out").mkdir()
    manifest = convert_to_shards(demo, tmp_path / "out", use_ray=False)
    assert len(manifest["shards"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_broken_manifest_is_a_clear_error(shards, tmp_path):
    bad = tmp_path / "bad"
    (bad / "meta").mkdir(parents=True)
    manifest = json.loads((shards / "shards.json").read_text())
    manifest["shards"] = manifest["shards"][1:]
    (bad / "shards.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match="does not continue the ids at 0"):
        ShardSource(bad, 8)


def test_cli_errors_are_one_line(demo, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert main(["convert", str(demo), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "out" in err[0]


def _copy_with_manifest(shards, tmp_path, edit) -> tuple:
    copy = shutil.copytree(shards, tmp_path / "copy")
    manifest = json.loads((copy / "shards.json").read_text())
    edit(manifest, copy)
    (copy / "shards.json").write_text(json.dumps(manifest))
    return copy


def test_a_shard_file_outside_the_root_is_refused(shards, tmp_path):
    def point_outside(manifest, copy):
        manifest["shards"][0]["file"] = "../../elsewhere/shard.parquet"

    copy = _copy_with_manifest(shards, tmp_path, point_outside)
    with pytest.raises(DatasetError, match=r"shards\.json: shard 'file'.*outside the dataset root"):
        ShardSource(copy, 8)


def test_a_shard_changed_since_it_was_written_is_refused(shards, tmp_path):
    copy = _copy_with_manifest(shards, tmp_path, lambda m, c: None)
    first = copy / json.loads((copy / "shards.json").read_text())["shards"][0]["file"]
    first.write_bytes(first.read_bytes() + b"\0")
    with pytest.raises(DatasetError, match=rf"{first}: \d+ bytes, but .* recorded \d+"):
        ShardSource(copy, 8)
    with pytest.raises(SystemExit) as exit_code:
        main(["inspect", str(copy)])
    assert exit_code.value.code != 0


def test_action_clip_on_shards_is_refused_naming_the_root(shards):
    """Clipped statistics need the frames; shards hold samples, so the run is refused."""
    with pytest.raises(DatasetError, match=r"shards.*'data.action_clip'"):
        DatasetView.open(DataConfig(root=str(shards), action_clip=[-1.0, 1.0]), 1, 4)
