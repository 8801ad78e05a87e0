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
    """Step -> the global batch's ids, from the attempt that ran each step last: a redone step,
    at any world size, replaces the earlier try's lines."""
    last: dict[int, tuple[int, dict[int, list[int]]]] = {}
    for row in rows:
        world, ranks = last.get(row["step"], (row["world_size"], {}))
        if world != row["world_size"] or row["rank"] in ranks:
            world, ranks = row["world_size"], {}
        ranks[row["rank"]] = row["ids"]
        last[row["step"]] = (world, ranks)
    return {
        step: [i for rank in sorted(ranks) for i in ranks[rank]]
        for step, (_, ranks) in sorted(last.items())
    }


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


def test_a_run_on_s3_survives_a_kill_a_crashed_checkpoint_write_and_a_damaged_checkpoint(
    s3_server, demo_root, reference, run_args, tmp_path, capsys
):
    """Data and run storage both on the S3 server, with `test_faults`' failures in one run:
    a worker is killed after step 4 (the run recovers from the step-3 checkpoint in the
    bucket), then dies while writing the step-6 checkpoint (never registered, so steps 4-6 are
    redone from step 3 again), and the run ends at step 9. Its step-9 shard is then truncated
    in the bucket, and a second driver invocation falls back to the step-6 checkpoint and
    trains on to step 10 with one worker. Compared with a straight 10-step two-worker run on
    disk: every global batch is the same, the 9-step export is bitwise the reference's step-9
    checkpoint, and the policies agree. Nothing is written to a local run directory; the
    driver lock in the bucket refuses a second driver."""
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

    faults = [
        "--ray.max_failures=2",
        "--debug.kill_at_step=4",
        "--debug.crash_in_checkpoint_at_step=6",
        "--debug.kill_rank=1",
    ]
    assert run.main(on_s3(9, *faults)) == 0
    run_dir = run_path(storage) / "s3run"
    assert (run_dir / ".fault_kill_4").is_file()  # the markers went to the bucket too
    assert (run_dir / ".fault_ckpt_6").is_file()
    latest = latest_checkpoint(str(run_dir))
    assert json.loads((latest / "train_state.json").read_text())["step"] == 9
    kept = [p.name for p in checkpoint_dirs(run_dir)]  # retention (num_to_keep=2) on S3 too
    assert kept == registered_checkpoints(run_dir) and len(kept) == 2
    for name in kept:  # each registered checkpoint holds both ranks' shards
        assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (run_dir / name).iterdir()}
    rows = _rows(run_dir)
    # Step 4 ran in all three attempts; steps 5-6 in the last two; steps 7-9 once.
    runs_of = lambda step: sum(r["step"] == step - 1 and r["rank"] == 1 for r in rows)  # noqa: E731
    assert [runs_of(step) for step in range(1, 10)] == [1, 1, 1, 3, 2, 2, 1, 1, 1]
    want = _global_batches(_rows(reference))
    assert _global_batches(rows) == {s: want[s] for s in range(9)}
    _assert_export_is_step9_of(reference, run_dir)

    # The lock in the bucket keeps a second driver out of the run.
    record = acquire(str(run_dir), "another training driver")
    capsys.readouterr()
    assert run.main(on_s3(10, "--ray.num_workers=1")) == 1
    assert "in use by another training driver" in capsys.readouterr().err
    release(str(run_dir), record)

    # The step-9 checkpoint's shard truncated in the bucket: a second invocation falls back to
    # the step-6 checkpoint and trains on with one worker.
    shard = latest / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-64])
    before = len(rows)
    assert run.main(on_s3(10, "--ray.num_workers=1")) == 0
    rows = _rows(run_dir)
    redone = rows[before:]
    assert sorted({r["step"] for r in redone}) == [6, 7, 8, 9]
    assert {r["world_size"] for r in redone} == {1}
    assert _global_batches(rows) == want
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
