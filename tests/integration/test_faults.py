"""Failures cost only the time since the last checkpoint: nothing lost, repeated or changed.

Every faulty run is compared with one uninterrupted reference run of the same recipe: the
exported weights must be bitwise equal and the committed per-step sample ids identical.
A crash inside a checkpoint write is covered by the object-storage fault run
(`test_object_store_e2e.py`), which also kills a worker; a local run's interrupted save is the
background-save kill below.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _runs import short_run_args
from safetensors.numpy import load_file

from raytrain_vla import run
from raytrain_vla.common.run_storage import run_path
from raytrain_vla.train.checkpoint_scratch import checkpoint_scratch_root
from raytrain_vla.train.resume import latest_checkpoint, registered_checkpoints

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 8  # checkpoints at 3 and 6 (save_interval=3) and 8
DEBUG = "--debug.log_sample_ids=true"


def committed_ids(run_dir: Path) -> dict[tuple[int, int], list[int]]:
    """Per (step, rank) ids of the attempt that finished: a redone step overwrites the earlier try."""
    out = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[(row["step"], row["rank"])] = row["ids"]
    return out


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = (
        load_file(str(a / "export" / "model.safetensors")),
        load_file(str(b / "export" / "model.safetensors")),
    )
    assert wa.keys() == wb.keys()
    for key in wa:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)


@pytest.fixture(scope="module")
def reference(demo_root, tmp_path_factory):
    storage = tmp_path_factory.mktemp("reference")
    args = _args(demo_root, storage, "reference", STEPS, DEBUG)
    assert run.main(args) == 0
    return storage / "reference"


def _args(demo_root, storage, name, steps, *extra):
    return short_run_args(demo_root, storage, name, steps, *extra)


def test_worker_sigkill_with_a_background_save_in_flight_recovers_bitwise(
    reference, demo_root, tmp_path
):
    """Rank 1 is SIGKILLed right after it starts the step-6 save in the background
    (`train.async_checkpoint`), before any rank could finish it: the step-3 checkpoint is the
    latest complete one, steps 3-5 run again, and the run ends bitwise where the synchronous
    reference ended. Retention (`ray.num_to_keep=1`) leaves only the last checkpoint.

    The run also validates every 2 steps, which the reference does not: validation has no side
    effects on the losses, the data order or the weights."""
    args = _args(
        demo_root, tmp_path, "killed", STEPS, DEBUG, "--ray.max_failures=1",
        "--ray.num_to_keep=1", "--train.async_checkpoint=true", "--train.val_interval=2",
    )  # fmt: skip
    assert run.main([*args, "--debug.kill_at_step=6", "--debug.kill_rank=1"]) == 0
    run_dir = tmp_path / "killed"
    assert (run_dir / ".fault_kill_6").exists()
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sum(r["step"] == 3 and r["rank"] == 1 for r in rows) == 2, "resumed from step 3"
    assert sum(r["step"] == 6 and r["rank"] == 1 for r in rows) == 1
    # Of the checkpoints at steps 3, 6 and 8 only the last is registered and left. An upload
    # the kill cut off before Ray registered it is pruned too: it appeared after this driver
    # took the run's lock.
    latest = latest_checkpoint(run_dir)
    on_disk = sorted(p for p in run_dir.glob("checkpoint_*") if p.is_dir())
    assert on_disk == [latest] and registered_checkpoints(run_dir) == [latest.name]
    assert json.loads((latest / "train_state.json").read_text())["step"] == STEPS
    assert (latest / "manifest.json").is_file()
    assert committed_ids(run_dir) == committed_ids(reference)
    assert losses(run_dir) == losses(reference)
    assert_same_weights(run_dir, reference)
    validated = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in validated if r["kind"] == "val"} >= {2, 4, 8}
    # The killed attempt's unreported step-6 directories were removed by the next attempt, and
    # Ray deleted each reported one once it had it: nothing is left in the node's temp dir.
    scratch = checkpoint_scratch_root(run_path(tmp_path) / "killed")
    assert scratch.is_dir() and not list(scratch.iterdir()), list(scratch.iterdir())


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(reference, demo_root, tmp_path):
    """The finished reference run (checkpoints at steps 6 and 8), its step-8 shard truncated,
    run again: it resumes from step 6, redoes steps 6-7 and ends bitwise where it ended.
    Runs before the test below extends the reference run."""
    run_dir = tmp_path / "reference"
    shutil.copytree(reference, run_dir)
    latest = latest_checkpoint(run_dir)
    assert json.loads((latest / "train_state.json").read_text())["step"] == STEPS
    shard = latest / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-64])
    before = len((run_dir / "samples.jsonl").read_text().splitlines())
    assert run.main(_args(demo_root, tmp_path, "reference", STEPS, DEBUG)) == 0
    redone = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()[before:]]
    assert sorted({r["step"] for r in redone}) == [6, 7]
    assert committed_ids(run_dir) == committed_ids(reference)
    assert_same_weights(run_dir, reference)


def test_an_error_a_retry_cannot_fix_is_not_retried(demo_root, tmp_path, capsys):
    """Bad data found after step 2 on rank 1: with max_failures=3 Ray would run the same steps
    four times and hit the same file each time; the run ends after the first attempt."""
    args = _args(demo_root, tmp_path, "bad_data", STEPS, DEBUG, "--ray.max_failures=3")
    assert run.main([*args, "--debug.bad_data_at_step=2", "--debug.kill_rank=1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: training failed:") and "injected bad data after step 2" in err
    rows = [
        json.loads(x) for x in (tmp_path / "bad_data" / "samples.jsonl").read_text().splitlines()
    ]
    assert sum(r["step"] == 0 and r["rank"] == 0 for r in rows) == 1, "the run was retried"


def test_changed_recipe_is_refused_before_anything_is_written(reference, demo_root, capsys):
    storage = reference.parent
    before = {p: p.stat().st_mtime_ns for p in reference.rglob("*")}
    args = _args(
        demo_root,
        storage,
        "reference",
        STEPS + 1,
        "--optimizer.lr=0.5",
        "--scheduler.warmup_steps=3",
    )
    assert run.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "optimizer.lr: 0.001 -> 0.5" in err[0]
        and "scheduler.warmup_steps: 2 -> 3" in err[0]
    )
    assert {p: p.stat().st_mtime_ns for p in reference.rglob("*")} == before
    # --ray.resume=never starts the changed recipe under a new name and leaves the old run alone.
    assert (
        run.main(
            [*_args(demo_root, storage, "reference", 2, "--optimizer.lr=0.5"), "--ray.resume=never"]
        )
        == 0
    )
    assert {p: p.stat().st_mtime_ns for p in reference.rglob("*")} == before
    fresh = [p for p in storage.iterdir() if p.name.startswith("reference-")]
    assert len(fresh) == 1 and (fresh[0] / "export" / "model.safetensors").exists()
    # That a changed worker count is not a recipe change (the run resumes) is shown by the
    # object-storage run's last invocation, which resumes a two-worker run on one worker.
