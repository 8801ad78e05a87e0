"""A run directory in object storage (a local S3 server): the driver lock, fresh run names, the
jsonl logs and checkpoint bookkeeping behave as they do on disk. No Ray."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from s3_server import BUCKET, S3Server  # noqa: E402

from raytrain_vla.common.run_storage import (  # noqa: E402
    JsonlLog,
    create_exclusive,
    local_directory,
    run_path,
    upload_directory,
)
from raytrain_vla.train.driver_lock import (  # noqa: E402
    LOCK_NAME,
    DriverLocked,
    acquire,
    lock_taken_at,
    release,
)
from raytrain_vla.train.resume import (  # noqa: E402
    CLAIM,
    SNAPSHOT,
    checkpoint_dirs,
    fresh_run_name,
    latest_checkpoint,
    prune_untracked_checkpoints,
)


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture()
def prefix(s3) -> str:
    """A fresh `s3://` prefix per test."""
    return f"s3://{BUCKET}/unit-{uuid.uuid4().hex[:8]}"


def _plant_lock(run_dir, **record) -> None:
    base = {"host": socket.gethostname(), "pid": 1, "pid_start": 0.0, "started": "earlier"}
    (run_dir / LOCK_NAME).write_text(json.dumps({**base, **record, "token": "theirs"}))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_uri_storage_path_is_a_upath_with_its_trailing_slash_dropped(prefix):
    path = run_path(prefix + "/runs/")
    assert str(path) == prefix + "/runs" and path.name == "runs"


def test_exclusive_create_on_s3_lets_one_claim_win(prefix):
    path = run_path(prefix) / "marker"
    assert create_exclusive(path, b"first")
    assert not create_exclusive(path, b"second")
    assert path.read_bytes() == b"first"


def test_the_lock_on_s3_refuses_a_second_driver_and_is_released(prefix):
    run_dir = run_path(prefix) / "run"
    record = acquire(prefix + "/run", "training driver")
    assert lock_taken_at(run_dir) is not None
    with pytest.raises(DriverLocked, match=f"pid {record['pid']} on host {socket.gethostname()}"):
        acquire(prefix + "/run", "training driver")
    release(prefix + "/run", record)
    assert not (run_dir / LOCK_NAME).exists() and lock_taken_at(run_dir) is None
    release(run_dir, acquire(run_dir, "training driver"))


def test_a_dead_drivers_lock_on_s3_is_taken_over_once(prefix, capsys):
    run_dir = run_path(prefix)
    _plant_lock(run_dir, pid=_dead_pid())
    record = acquire(run_dir, "training driver")
    assert "taking over the lock of a driver that is gone" in capsys.readouterr().err
    assert json.loads((run_dir / LOCK_NAME).read_text())["token"] == record["token"]
    with pytest.raises(DriverLocked):  # the winner's lock is live: no second takeover
        acquire(run_dir, "training driver")
    release(run_dir, record)


def test_another_hosts_lock_on_s3_is_never_broken(prefix):
    run_dir = run_path(prefix)
    _plant_lock(run_dir, host="elsewhere", pid=_dead_pid())
    with pytest.raises(DriverLocked, match=f"delete {run_dir / LOCK_NAME}"):
        acquire(run_dir, "training driver")
    assert json.loads((run_dir / LOCK_NAME).read_text())["token"] == "theirs"


def test_fresh_run_names_on_s3_are_claimed_and_never_reused(prefix):
    storage = run_path(prefix)
    (storage / "old" / "metrics.jsonl").write_text("{}\n")  # a run from before: used
    assert fresh_run_name(prefix, "demo") == "demo"
    assert (storage / "demo" / CLAIM).is_file()
    first = fresh_run_name(prefix, "demo")
    assert first.startswith("demo-") and first != "demo"
    assert fresh_run_name(prefix, "demo") not in ("demo", first)
    assert fresh_run_name(prefix, "old").startswith("old-")


def test_a_jsonl_log_on_s3_keeps_every_line_across_reopens(prefix):
    path = run_path(prefix) / "metrics.jsonl"
    first = JsonlLog(path, flush_every_s=3600)
    first.write({"step": 1})
    assert not path.exists()  # buffered until a flush
    first.write({"step": 2})
    first.close()
    second = JsonlLog(path)  # a resumed attempt
    second.write({"step": 2, "redone": True})
    second.write({"step": 3})
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows == [{"step": 1}, {"step": 2}, {"step": 2, "redone": True}, {"step": 3}]


def test_unregistered_checkpoints_on_s3_are_pruned_and_registered_ones_kept(prefix, tmp_path):
    run_dir = run_path(prefix)
    for name in ("checkpoint_1", "checkpoint_2", "checkpoint_3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train_state.json").write_text("{}")
        upload_directory(tmp_path / name, run_dir / name)
    results = [{"checkpoint_dir_name": n} for n in ("checkpoint_1", "checkpoint_2")]
    snapshot = {"checkpoint_results": results, "latest_checkpoint_result": results[-1]}
    (run_dir / SNAPSHOT).write_text(json.dumps(snapshot))
    assert [p.name for p in checkpoint_dirs(run_dir)] == [f"checkpoint_{i}" for i in (1, 2, 3)]
    assert prune_untracked_checkpoints(run_dir) == ["checkpoint_3"]
    assert [p.name for p in checkpoint_dirs(run_dir)] == ["checkpoint_1", "checkpoint_2"]
    assert str(latest_checkpoint(prefix)) == f"{prefix}/checkpoint_2"


def test_without_a_snapshot_only_checkpoints_newer_than_the_lock_are_pruned(prefix, tmp_path):
    run_dir = run_path(prefix)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "a").write_text("x")
    upload_directory(tmp_path / "ckpt", run_dir / "checkpoint_old")
    assert prune_untracked_checkpoints(run_dir) == []  # no lock: nothing is provably ours
    time.sleep(1.1)  # the store stamps objects to the second
    record = acquire(run_dir, "training driver")
    upload_directory(tmp_path / "ckpt", run_dir / "checkpoint_new")
    assert prune_untracked_checkpoints(run_dir) == ["checkpoint_new"]
    release(run_dir, record)
    assert [p.name for p in checkpoint_dirs(run_dir)] == ["checkpoint_old"]


def test_a_directory_round_trips_through_s3(prefix, tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "a.bin").write_bytes(b"\0\1")
    (tmp_path / "src" / "sub" / "b.txt").write_text("b")
    remote = run_path(prefix) / "dir"
    (remote / "stale.txt").write_text("gone after the upload")
    upload_directory(tmp_path / "src", remote)
    with local_directory(str(remote)) as local:
        got = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*.*")}
    assert got == {"a.bin": b"\0\1", "sub/b.txt": b"b"}
    assert not local.exists()
    with pytest.raises(FileNotFoundError, match=f"{prefix}/nothing: no such directory"):
        with local_directory(f"{prefix}/nothing"):
            pass


def test_sweep_results_on_s3_are_the_bytes_written_on_disk(prefix, tmp_path):
    from raytrain_vla.tuning.sweep import write_results

    rows = [
        {"trial_id": "a", "lr": 0.1, "val_loss": 1.5},
        {"trial_id": "b", "lr": 1, "val_loss": 2},
    ]
    local = write_results(rows, tmp_path)
    remote = write_results(rows, run_path(prefix))
    assert str(remote) == f"{prefix}/results.csv"
    assert remote.read_bytes() == local.read_bytes()
    assert local.read_bytes().startswith(b"trial_id,lr,val_loss\r\n")
