"""Resume rules on plain files: which keys may change, and fresh names never overwrite."""

import json

from raytrain_vla.config import load_config, to_dict
from raytrain_vla.train.resume import (
    SNAPSHOT,
    fresh_run_name,
    latest_checkpoint,
    prune_untracked_checkpoints,
    recipe_differences,
)


def test_recipe_differences_ignore_resumable_keys():
    old = to_dict(load_config())
    new = to_dict(
        load_config(None, ["--ray.num_workers=1", "--train.steps=9", "--train.micro_batch_size=16"])
    )
    assert recipe_differences(old, new) == []
    changed = to_dict(load_config(None, ["--optimizer.lr=0.5", "--data.chunk_size=4"]))
    assert recipe_differences(old, changed) == [
        "data.chunk_size: 8 -> 4",
        "optimizer.lr: 0.001 -> 0.5",
    ]


def test_fresh_run_name_never_reuses_an_existing_directory(tmp_path):
    assert fresh_run_name(tmp_path, "demo") == "demo"
    (tmp_path / "demo").mkdir()
    first = fresh_run_name(tmp_path, "demo")
    assert first.startswith("demo-") and not (tmp_path / first).exists()
    (tmp_path / first).mkdir()
    assert fresh_run_name(tmp_path, "demo") not in ("demo", first)


def test_no_snapshot_means_a_new_run(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None


def test_prune_keeps_registered_checkpoints_and_removes_the_rest(tmp_path):
    for name in ("checkpoint_a", "checkpoint_b", "checkpoint_orphan"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train_state.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    results = [{"checkpoint_dir_name": "checkpoint_a"}, {"checkpoint_dir_name": "checkpoint_b"}]
    (tmp_path / SNAPSHOT).write_text(json.dumps({"checkpoint_results": results}))
    assert prune_untracked_checkpoints(tmp_path) == ["checkpoint_orphan"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint_a", "checkpoint_b", SNAPSHOT, "metrics.jsonl"]


def test_prune_without_a_snapshot_removes_every_unregistered_upload(tmp_path):
    (tmp_path / "checkpoint_x").mkdir()
    assert prune_untracked_checkpoints(tmp_path) == ["checkpoint_x"]
    assert prune_untracked_checkpoints(tmp_path / "missing") == []
