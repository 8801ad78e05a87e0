"""Training on a dataset in object storage (a local S3 server) reads the batches and learns the
weights that the same files on disk give, and the data commands work on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _runs import short_run_args
from safetensors.numpy import load as load_bytes
from safetensors.numpy import load_file

from raytrain_vla import cli, data_cli, run
from raytrain_vla.common.location import as_path

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _sample_ids(run_dir: Path) -> dict[tuple[int, int], list[int]]:
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["rank"]): r["ids"] for r in rows}


def test_training_on_s3_matches_training_on_disk(
    s3_server, demo_root, reference, run_args, tmp_path
):
    """The data in the bucket, the run on local disk: the first 9 steps read the batches of the
    disk reference's first 9, and the export is bitwise its step-9 checkpoint."""
    uri = s3_server.upload(demo_root, "demo_e2e")
    debug = "--debug.log_sample_ids=true"
    assert run.main(run_args("s3", 9, debug, f"--data.root={uri}")) == 0
    want = {key: ids for key, ids in _sample_ids(reference).items() if key[0] < 9}
    assert _sample_ids(tmp_path / "runs" / "s3") == want
    _assert_export_is_step9_of(reference, tmp_path / "runs" / "s3")


def test_stats_and_inspect_work_on_s3(s3_server, demo_root, capsys):
    uri = s3_server.upload(demo_root, "demo_stats")
    stats = as_path(uri) / "meta" / "stats.json"
    stats.unlink()
    assert data_cli.main(["stats", uri]) == 0
    got = json.loads(stats.read_text())
    want = json.loads((demo_root / "meta" / "stats.json").read_text())
    for feat in ("observation.state", "action"):
        np.testing.assert_allclose(got[feat]["mean"], want[feat]["mean"], rtol=1e-6)
        np.testing.assert_allclose(got[feat]["max"], want[feat]["max"], rtol=1e-6)
    capsys.readouterr()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = "raytrain-vla data inspect s3://robot-data/so100_pick_place"
    assert line in readme  # the README's command, on this server's copy
    fresh = s3_server.upload(demo_root, "demo_inspect")  # stats as the writer made them
    assert cli.main(line.replace("s3://robot-data/so100_pick_place", fresh).split()[1:]) == 0
    assert "no problems found" in capsys.readouterr().out


def _global_batches(rows: list[dict]) -> dict[int, list[int]]:
    """Step -> the global batch's ids, from the attempt that finished each step (a redone step
    replaces the earlier try's lines)."""
    committed = {(r["step"], r["rank"]): r for r in rows}
    out: dict[int, list[int]] = {}
    for (step, _), row in sorted(committed.items()):
        out.setdefault(step, []).extend(row["ids"])
    return out


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(ray_cluster, demo_root, tmp_path_factory) -> Path:
    """A straight 10-step two-worker run on disk, with its step-9 checkpoint exported beside it:
    what the runs in the bucket must reproduce."""
    from raytrain_vla import export

    runs = tmp_path_factory.mktemp("reference")
    args = short_run_args(demo_root, runs, "reference", 10, "--debug.log_sample_ids=true")
    assert run.main(args) == 0
    step9 = next(
        p for p in (runs / "reference").glob("checkpoint_*")
        if p.is_dir() and json.loads((p / "train_state.json").read_text())["step"] == 9
    )  # fmt: skip
    assert export.main([str(step9), str(runs / "reference_step9")]) == 0
    return runs / "reference"


def _assert_export_is_step9_of(reference: Path, run_dir) -> None:
    want = load_file(str(reference.parent / "reference_step9" / "model.safetensors"))
    got = load_bytes((run_dir / "export" / "model.safetensors").read_bytes())
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_run_stored_on_s3_survives_a_kill_resumes_at_another_world_size_and_exports(
    s3_server, demo_root, reference, run_args, tmp_path, capsys
):
    """Data and run storage both on the S3 server. A worker is killed after step 4 of 9 and the
    run recovers from the step-3 checkpoint in the bucket; a second driver invocation resumes
    that run from the bucket to step 10 with one worker. Compared with a straight 10-step
    two-worker run on disk: every global batch is the same, the 9-step export is bitwise the
    reference's step-9 checkpoint, and the policies agree. Nothing is written to a local run
    directory; the driver lock in the bucket refuses a second driver."""
    from raytrain_vla import policy
    from raytrain_vla.common.run_storage import run_path
    from raytrain_vla.train.driver_lock import acquire, release
    from raytrain_vla.train.resume import (
        checkpoint_dirs,
        latest_checkpoint,
        registered_checkpoints,
    )

    data = s3_server.upload(demo_root, "demo_storage")
    storage = f"s3://raytrain-vla-test/runs-{tmp_path.name}"
    debug = "--debug.log_sample_ids=true"

    def on_s3(steps: int, *extra: str) -> list[str]:
        args = run_args("s3run", steps, debug, f"--data.root={data}", *extra)
        return [*args, f"--ray.storage_path={storage}"]

    kill = ["--ray.max_failures=1", "--debug.kill_at_step=4", "--debug.kill_rank=1"]
    assert run.main(on_s3(9, *kill)) == 0
    run_dir = run_path(storage) / "s3run"
    assert (run_dir / ".fault_kill_4").is_file()  # the marker went to the bucket too
    latest = latest_checkpoint(str(run_dir))
    assert json.loads((latest / "train_state.json").read_text())["step"] == 9
    kept = [p.name for p in checkpoint_dirs(run_dir)]  # retention (num_to_keep=2) on S3 too
    assert kept == registered_checkpoints(run_dir) and len(kept) == 2
    rows = _rows(run_dir)
    assert sum(r["step"] == 3 and r["rank"] == 1 for r in rows) == 2, "step 4 was redone"
    _assert_export_is_step9_of(reference, run_dir)

    # The lock in the bucket keeps a second driver out of the run.
    record = acquire(str(run_dir), "another training driver")
    capsys.readouterr()
    assert run.main(on_s3(10, "--ray.num_workers=1")) == 1
    assert "in use by another training driver" in capsys.readouterr().err
    release(str(run_dir), record)

    # A second invocation resumes from the bucket's step-9 checkpoint, with one worker.
    assert run.main(on_s3(10, "--ray.num_workers=1")) == 0
    rows = _rows(run_dir)
    assert [r["world_size"] for r in rows if r["step"] == 9] == [1]
    assert sum(r["step"] == 8 for r in rows) == 2, "the resume redid steps before step 9"
    assert _global_batches(rows) == _global_batches(_rows(reference))
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics if m["kind"] == "train"}) == list(range(1, 11))
    assert not (run_dir / ".driver.lock").exists()
    assert not Path("s3:").exists() and not (tmp_path / "runs" / "s3run").exists()

    # The README's report and export commands, on this run in the bucket.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    named = "s3://robot-data/runs/pick_v1"
    for line in (f"raytrain-vla report {named}", f"raytrain-vla export {named}/checkpoint_..."):
        assert line in readme
    assert cli.main(["report", str(run_dir)]) == 0
    for name in ("training.png", "predictions.png"):
        assert (run_dir / "report" / name).read_bytes()[:4] == b"\x89PNG", name
    ckpt = str(latest_checkpoint(str(run_dir)))
    assert cli.main(["export", ckpt, str(tmp_path / "policy")]) == 0
    exported = load_file(str(tmp_path / "policy" / "model.safetensors"))
    final = load_bytes((run_dir / "export" / "model.safetensors").read_bytes())
    for key in final:
        np.testing.assert_array_equal(exported[key], final[key], err_msg=key)

    # The export in the bucket loads as a policy and predicts what the reference's does.
    obs = {
        "observation.image": np.zeros((32, 32, 3), np.uint8),
        "state": np.zeros(2, np.float32),
        "instruction": "reach the red disc",
    }
    ours = policy.load(str(run_dir / "export"), seed=3).predict_action(obs)
    theirs = policy.load(reference / "export", seed=3).predict_action(obs)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_on_s3_a_crash_in_a_checkpoint_write_and_a_damaged_checkpoint_lose_nothing(
    s3_server, demo_root, reference, run_args, tmp_path
):
    """`test_faults`' checkpoint cases with the data and the run in the bucket: a worker dies
    while writing the step-6 checkpoint (never registered, so the run redoes steps 4-6 from the
    step-3 one), then the step-9 checkpoint's shard is truncated in the bucket and the next
    invocation falls back to step 6 and redoes steps 7-9. Every global batch and the export stay
    bitwise those of an uninterrupted run on disk."""
    from raytrain_vla.common.run_storage import run_path
    from raytrain_vla.train.resume import latest_checkpoint

    data = s3_server.upload(demo_root, "demo_faults")
    storage = f"s3://raytrain-vla-test/runs-{tmp_path.name}"

    def on_s3(*extra: str) -> list[str]:
        debug = ["--debug.log_sample_ids=true", "--ray.max_failures=1"]
        args = run_args("faults", 9, *debug, f"--data.root={data}", *extra)
        return [*args, f"--ray.storage_path={storage}"]

    crash = ["--debug.crash_in_checkpoint_at_step=6", "--debug.kill_rank=1"]
    assert run.main(on_s3(*crash)) == 0
    run_dir = run_path(storage) / "faults"
    rows = _rows(run_dir)
    assert sum(r["step"] == 3 and r["rank"] == 0 for r in rows) == 2, "steps 4-6 were redone"
    want = _global_batches(_rows(reference))
    assert _global_batches(rows) == {s: want[s] for s in range(9)}
    _assert_export_is_step9_of(reference, run_dir)

    latest = latest_checkpoint(str(run_dir))
    assert json.loads((latest / "train_state.json").read_text())["step"] == 9
    shard = latest / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-64])
    assert run.main(on_s3()) == 0
    redone = _rows(run_dir)[len(rows) :]
    assert sorted({r["step"] for r in redone}) == [6, 7, 8]
    assert _global_batches(_rows(run_dir)) == {s: want[s] for s in range(9)}
    _assert_export_is_step9_of(reference, run_dir)
