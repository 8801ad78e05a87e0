"""Resume rules on plain files: which keys may change, and fresh names never overwrite."""

import json

import pytest
import yaml

from raytrain_vla.config import load_config, recipe_hash, to_dict
from raytrain_vla.config.recipe import recipe_differences
from raytrain_vla.data.plan import PLAN_VERSION
from raytrain_vla.train.checkpoint import CONFIG
from raytrain_vla.train.resume import (
    SNAPSHOT,
    ResumeRefused,
    check_resume,
    fresh_run_name,
    latest_checkpoint,
    prune_untracked_checkpoints,
)
from raytrain_vla.train.train_state import TRAIN_STATE, TrainState


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
    assert fresh_run_name(tmp_path, "demo") == "demo"  # and claims it
    first = fresh_run_name(tmp_path, "demo")
    assert first.startswith("demo-") and (tmp_path / first).is_dir()
    assert fresh_run_name(tmp_path, "demo") not in ("demo", first)


def test_no_snapshot_means_a_new_run(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None


def register(run_dir, names: list[str]) -> None:
    """A snapshot as Ray Train writes it, recording `names` (the last is the latest)."""
    results = [{"checkpoint_dir_name": n} for n in names]
    latest = results[-1] if results else None
    snapshot = {"checkpoint_results": results, "latest_checkpoint_result": latest}
    (run_dir / SNAPSHOT).write_text(json.dumps(snapshot))


def make_checkpoint(run_dir, name: str, step: int = 10, cfg=None, plan=PLAN_VERSION) -> None:
    cfg = cfg or load_config()
    (run_dir / name).mkdir(parents=True)
    state = TrainState(
        step=step, epoch=0, sample_in_epoch=0, samples_seen=step * 64, world_size=2,
        run_name="demo", config_hash=recipe_hash(cfg), dataset_fingerprint="fingerprint",
        sample_plan=plan,
    )  # fmt: skip
    (run_dir / name / TRAIN_STATE).write_text(json.dumps(state.to_dict()))


def test_prune_removes_only_unregistered_uploads_newer_than_the_latest_registered(tmp_path):
    for name in ("checkpoint_1", "checkpoint_2", "checkpoint_3"):
        make_checkpoint(tmp_path, name)
    make_checkpoint(tmp_path, "checkpoint_0")  # older than every registered one: kept
    (tmp_path / "metrics.jsonl").write_text("")
    register(tmp_path, ["checkpoint_1", "checkpoint_2"])
    assert prune_untracked_checkpoints(tmp_path) == ["checkpoint_3"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint_0", "checkpoint_1", "checkpoint_2", SNAPSHOT, "metrics.jsonl"]


@pytest.mark.parametrize("snapshot", [None, "", '{"checkpoint_resu', "[1, 2]"])
def test_a_missing_or_unreadable_snapshot_never_deletes_checkpoints(tmp_path, snapshot):
    make_checkpoint(tmp_path, "checkpoint_1")
    if snapshot is not None:
        (tmp_path / SNAPSHOT).write_text(snapshot)
    assert prune_untracked_checkpoints(tmp_path) == []
    assert (tmp_path / "checkpoint_1").is_dir()
    assert prune_untracked_checkpoints(tmp_path / "missing") == []


@pytest.mark.parametrize("snapshot", ["", '{"checkpoint_resu', "[1, 2]"])
def test_an_unreadable_snapshot_is_an_error_naming_the_file(tmp_path, snapshot):
    make_checkpoint(tmp_path, "checkpoint_1")
    (tmp_path / SNAPSHOT).write_text(snapshot)
    with pytest.raises(ResumeRefused, match=f"{tmp_path / SNAPSHOT}: "):
        check_resume(load_config(), tmp_path, "fingerprint")


def test_checkpoints_without_a_snapshot_refuse_the_start_and_say_how_to_keep_them(tmp_path):
    make_checkpoint(tmp_path, "checkpoint_1")
    make_checkpoint(tmp_path, "checkpoint_2")
    with pytest.raises(ResumeRefused) as err:
        check_resume(load_config(), tmp_path, "fingerprint")
    message = str(err.value)
    assert str(tmp_path) in message and "2 checkpoint directories but no" in message
    assert f"raytrain_vla.export {tmp_path / 'checkpoint_2'} OUT" in message
    assert (tmp_path / "checkpoint_1").is_dir() and (tmp_path / "checkpoint_2").is_dir()


def test_resume_is_refused_when_train_steps_is_below_the_checkpoints_step(tmp_path):
    cfg = load_config(None, ["--train.steps=50"])
    make_checkpoint(tmp_path, "checkpoint_1", step=80, cfg=cfg)
    register(tmp_path, ["checkpoint_1"])
    with pytest.raises(ResumeRefused, match="train.steps is 50 but the checkpoint is at step 80"):
        check_resume(cfg, tmp_path, "fingerprint")
    longer = load_config(None, ["--train.steps=80"])
    assert check_resume(longer, tmp_path, "fingerprint") == tmp_path / "checkpoint_1"


def test_a_hash_of_an_older_version_resumes_when_no_recipe_key_differs(tmp_path):
    """Hashes written before the recipe covered only the selected family's options differ from
    today's; the checkpoint's config.yaml, compared key by key, decides."""
    cfg = load_config()
    make_checkpoint(tmp_path, "checkpoint_1", cfg=cfg)
    state = json.loads((tmp_path / "checkpoint_1" / TRAIN_STATE).read_text())
    (tmp_path / "checkpoint_1" / TRAIN_STATE).write_text(
        json.dumps({**state, "config_hash": "0123456789abcdef"})
    )
    old_tree = to_dict(cfg)
    old_tree["model"]["smolvla"] = {"vlm_path": "/somewhere/else"}  # another family's section
    (tmp_path / "checkpoint_1" / CONFIG).write_text(yaml.safe_dump(old_tree))
    register(tmp_path, ["checkpoint_1"])
    assert check_resume(cfg, tmp_path, "fingerprint") == tmp_path / "checkpoint_1"
    changed = load_config(None, ["--optimizer.lr=0.5"])
    with pytest.raises(ResumeRefused, match=r"optimizer.lr: 0.001 -> 0.5"):
        check_resume(changed, tmp_path, "fingerprint")


def test_a_checkpoint_of_an_older_sample_plan_is_refused_naming_the_plan(tmp_path):
    """Checkpoints written before plan 2 carry no `sample_plan` and read as 1: resuming them
    under plan 2 would repeat and skip samples, so the driver says so before Ray starts."""
    make_checkpoint(tmp_path, "checkpoint_1", plan=None)
    state = json.loads((tmp_path / "checkpoint_1" / TRAIN_STATE).read_text())
    del state["sample_plan"]
    (tmp_path / "checkpoint_1" / TRAIN_STATE).write_text(json.dumps(state))
    register(tmp_path, ["checkpoint_1"])
    with pytest.raises(ResumeRefused, match=f"sample plan: version 1 -> {PLAN_VERSION}.*init_from"):
        check_resume(load_config(), tmp_path, "fingerprint")


def test_without_a_snapshot_only_uploads_made_since_this_driver_took_the_lock_go(tmp_path):
    """Ray writes no snapshot before its first registration, so an attempt killed before then
    leaves an upload nothing tracks; the driver's lock proves it belongs to this driver."""
    import os

    from raytrain_vla.train.driver_lock import acquire, release

    make_checkpoint(tmp_path, "checkpoint_a")  # before the lock: another driver's, kept
    os.utime(tmp_path / "checkpoint_a", (1_000_000, 1_000_000))
    record = acquire(tmp_path, "training driver")
    make_checkpoint(tmp_path, "checkpoint_b")  # an attempt of this driver, never registered
    assert prune_untracked_checkpoints(tmp_path) == ["checkpoint_b"]
    assert (tmp_path / "checkpoint_a").is_dir()
    release(tmp_path, record)
    make_checkpoint(tmp_path, "checkpoint_c")
    assert prune_untracked_checkpoints(tmp_path) == []  # no lock: no proof
