"""LeRobot v2.1 conformance: a v2.1 copy of each fixture reads exactly like the v3.0 original.

`_v21_writer` re-writes the fixtures in the v2.1 layout (per-episode parquet and mp4, jsonl
metadata, `episodes_stats.jsonl` and no `stats.json`). With lossless video copies every item,
decoded pixels included, must be identical; with RGB re-encoding through `encode_video` only the
pixels may move, within what yuv420p re-encoding costs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _paths import fixtures_root
from _v21_writer import write_v21_copy

from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.lerobot_v21 import aggregate_stats
from raytrain_vla.data.formats.random_access import open_dataset

KEY = "observation.image"
NAMES = ["pusht_like", "pusht_like_images", "demo"]


class _Pairs(dict):
    """name -> (v3.0 root, lossless v2.1 copy), converted on first use (spreads the cost)."""

    def __init__(self, tmp):
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> tuple:
        if name == "demo":
            root = write_demo_dataset(self.tmp / "demo_v30", 5, seed=3)
        else:
            root = fixtures_root() / "lerobot_v3" / name
        self[name] = (root, write_v21_copy(root, self.tmp / f"{name}_v21"))
        return self[name]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> _Pairs:
    return _Pairs(tmp_path_factory.mktemp("v21"))


def _windows(name: str) -> dict:
    if name == "demo":
        return {"action": [0.1 * k for k in range(8)], KEY: [-0.2, 0.0], "timestamp": [-0.1, 0.0]}
    ref = fixtures_root() / "lerobot_v3" / f"{name}_reference.json"
    return json.loads(ref.read_text())["delta_timestamps"]


@pytest.mark.parametrize("name", NAMES)
def test_v21_metadata_matches_v30(pairs, name):
    v30, v21 = (LeRobotMeta.load(r) for r in pairs[name])
    assert (v21.version, v30.version) == ("v2.1", "v3.0")
    assert (v21.fps, v21.num_episodes, v21.total_frames) == (
        v30.fps,
        v30.num_episodes,
        v30.total_frames,
    )
    assert v21.tasks == v30.tasks and v21.camera_keys == v30.camera_keys
    for col in ("episode_index", "length", "dataset_from_index", "dataset_to_index"):
        np.testing.assert_array_equal(v21.episodes[col], v30.episodes[col])
    for e in range(v21.num_episodes):
        assert v21.episode_tasks(e) == v30.episode_tasks(e)
        want = f"data/chunk-{e // 2:03d}/episode_{e:06d}.parquet"  # chunks_size 2
        assert v21.data_file(e) == pairs[name][1] / want and v21.data_file(e).is_file()
        for key in v21.video_keys:
            assert v21.video_from_timestamp(key, e) == 0.0
            want = f"videos/chunk-{e // 2:03d}/{key}/episode_{e:06d}.mp4"
            assert v21.video_file(key, e) == pairs[name][1] / want
    assert not (pairs[name][1] / "meta/stats.json").exists()
    assert set(v21.stats) == set(v30.stats)  # aggregated from episodes_stats.jsonl
    for key, st in v30.stats.items():
        for s in ("min", "max", "mean", "std"):
            np.testing.assert_allclose(v21.stats[key][s], st[s], rtol=1e-6, atol=1e-9, err_msg=key)
        assert int(v21.stats[key]["count"][0]) == v21.total_frames


@pytest.mark.parametrize("name", NAMES)
def test_open_dataset_items_identical(pairs, name):
    a, b = (open_dataset(r, _windows(name)) for r in pairs[name])
    assert len(a) == len(b)
    edges = [*a.meta.episode_from_index, *(a.meta.episode_to_index - 1)]
    for i in sorted({*range(0, len(a), 3), *map(int, edges)}):  # every 3rd + episode edges
        x, y = a[i], b[i]
        assert list(x) == list(y)
        assert x.pop("task") == y.pop("task")
        for k in x:
            assert (x[k].shape, x[k].dtype) == (y[k].shape, y[k].dtype), k
            assert bool((x[k] == y[k]).all()), f"item {i} key {k}"


@pytest.mark.parametrize("name", NAMES)
def test_streaming_source_identical(pairs, name):
    a, b = (LeRobotSource(LeRobotMeta.load(r), chunk_size=6) for r in pairs[name])
    assert a.camera_keys == b.camera_keys
    ids = np.random.default_rng(0).permutation(a.meta.total_frames)
    x, y = a.read(ids), b.read(ids)
    assert x.keys() == y.keys()
    for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_reencoded_video_stays_close(pairs, tmp_path):
    """Written the way a fresh v2.1 writer would (RGB frames -> encode_video)."""
    v30 = pairs["pusht_like"][0]
    v21 = write_v21_copy(v30, tmp_path / "v21", lossless=False)
    a, b = open_dataset(v21, _windows("pusht_like")), open_dataset(v30, _windows("pusht_like"))
    worst, mean = 0.0, []
    for i in range(0, len(a), 3):
        x, y = a[i], b[i]
        diff = (x.pop(KEY) - y.pop(KEY)).abs()
        worst, mean = max(worst, float(diff.max())), [*mean, float(diff.mean())]
        assert all(bool((x[k] == y[k]).all()) for k in x if k != "task")
    assert worst <= 48 / 255 and np.mean(mean) < 0.5 / 255, (worst * 255, np.mean(mean) * 255)


def test_stats_json_wins_and_pooling_is_exact(pairs, tmp_path):
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=(n, 3)) for n in (5, 17, 2)]
    per_ep = [
        {"min": p.min(0), "max": p.max(0), "mean": p.mean(0), "std": p.std(0), "count": [len(p)]}
        for p in parts
    ]
    got, whole = aggregate_stats(per_ep), np.concatenate(parts)
    np.testing.assert_allclose(got["mean"], whole.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got["std"], whole.std(0), rtol=1e-12)
    np.testing.assert_array_equal(got["min"], whole.min(0))
    assert got["count"].tolist() == [24]

    v21 = pairs["demo"][1]
    (v21 / "meta/stats.json").write_text(json.dumps({"action": {"mean": [7.0, 8.0]}}))
    try:
        assert LeRobotMeta.load(v21).stats["action"]["mean"].tolist() == [7.0, 8.0]
    finally:
        (v21 / "meta/stats.json").unlink()


def test_broken_v21_metadata_names_the_file(pairs, tmp_path):
    root = shutil.copytree(pairs["demo"][1], tmp_path / "v21")
    lines = (root / "meta/episodes.jsonl").read_text().splitlines()
    (root / "meta/episodes.jsonl").write_text("\n".join(lines[:2] + ["{oops"] + lines[3:]))
    with pytest.raises(DatasetError, match=r"episodes\.jsonl, line 3"):
        LeRobotMeta.load(root)
    (root / "meta/episodes.jsonl").write_text("\n".join(lines[:-1]))
    with pytest.raises(DatasetError, match=r"episodes\.jsonl: 4 episodes but info.json says 5"):
        LeRobotMeta.load(root)
    (root / "meta/tasks.jsonl").unlink()
    with pytest.raises(DatasetError, match=r"tasks\.jsonl: missing"):
        LeRobotMeta.load(root)
