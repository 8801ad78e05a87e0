"""Shards end to end: the Ray Data convert job, then training on shards reads the same batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from raytrain_vla import run
from raytrain_vla.data.formats.lerobot import LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.shards import ShardSource, convert_to_shards

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _sample_ids(run_dir: Path) -> dict[tuple[int, int], list[int]]:
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["rank"]): r["ids"] for r in rows}


def test_train_on_shards_matches_lerobot_source(demo_root, run_args, tmp_path):
    shards = tmp_path / "shards"
    manifest = convert_to_shards(demo_root, shards, samples_per_shard=200, image_format="png")
    n = LeRobotMeta.load(demo_root).total_frames
    assert [e["num_rows"] for e in manifest["shards"]] == [200] * (n // 200) + [n % 200]
    ids = np.random.default_rng(0).choice(n, 64, replace=False)
    got, want = (
        ShardSource(shards, 8).read(ids),
        LeRobotSource(LeRobotMeta.load(demo_root), 8).read(ids),
    )
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)

    debug = "--debug.log_sample_ids=true"
    assert run.main(run_args("src", 4, debug)) == 0
    assert run.main(run_args("shards", 4, debug, f"--data.root={shards}")) == 0
    runs = tmp_path / "runs"
    src_ids, shard_ids = _sample_ids(runs / "src"), _sample_ids(runs / "shards")
    assert sorted({s for s, _ in src_ids}) == list(range(4))
    assert shard_ids == src_ids

    src = load_file(str(runs / "src" / "export" / "model.safetensors"))
    from_shards = load_file(str(runs / "shards" / "export" / "model.safetensors"))
    assert src.keys() == from_shards.keys()
    for key in src:
        np.testing.assert_array_equal(from_shards[key], src[key], err_msg=key)
