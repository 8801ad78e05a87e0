"""One driver per run directory: a second driver is refused, a dead one's lock is taken over,
another host's lock is never broken silently, and fresh run names are claimed atomically."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from raytrain_vla import run as run_cli
from raytrain_vla import tune as tune_cli
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.train.driver_lock import LOCK_NAME, DriverLocked, acquire, release
from raytrain_vla.train.resume import fresh_run_name


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(directory, **record) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    base = {"host": socket.gethostname(), "pid": 1, "pid_start": 0.0, "started": "earlier"}
    (directory / LOCK_NAME).write_text(json.dumps({**base, **record, "token": "theirs"}))


def test_a_second_driver_is_refused_naming_the_holder(tmp_path):
    record = acquire(tmp_path / "run", "training driver")
    with pytest.raises(DriverLocked) as err:
        acquire(tmp_path / "run", "training driver")
    message = str(err.value)
    assert f"pid {record['pid']}" in message and socket.gethostname() in message
    release(tmp_path / "run", record)
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    release(tmp_path / "run", acquire(tmp_path / "run", "training driver"))


def test_a_dead_drivers_lock_is_taken_over_with_a_message(tmp_path, capsys):
    _plant(tmp_path, pid=_dead_pid())
    record = acquire(tmp_path, "training driver")
    assert "taking over the lock of a driver that is gone" in capsys.readouterr().err
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == record["token"]


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    """The pid runs, but it is a process that started after the lock was written."""
    _plant(tmp_path, pid=1, pid_start=12345.0)
    release(tmp_path, acquire(tmp_path, "training driver"))


def test_a_live_process_keeps_its_lock(tmp_path):
    import psutil

    parent = psutil.Process().parent()
    _plant(tmp_path, pid=parent.pid, pid_start=parent.create_time())
    with pytest.raises(DriverLocked):
        acquire(tmp_path, "training driver")


def test_another_hosts_lock_is_never_broken_here(tmp_path):
    _plant(tmp_path, host="some-other-node", pid=_dead_pid())
    with pytest.raises(DriverLocked) as err:
        acquire(tmp_path, "sweep driver")
    message = str(err.value)
    assert "some-other-node" in message and f"delete {tmp_path / LOCK_NAME}" in message


def test_release_leaves_a_lock_that_another_driver_took_over(tmp_path):
    record = acquire(tmp_path, "training driver")
    _plant(tmp_path, pid=_dead_pid())  # someone broke ours and took it
    release(tmp_path, record)
    assert (tmp_path / LOCK_NAME).exists()


def test_fresh_names_are_unique_when_drivers_start_together(tmp_path):
    (tmp_path / "demo").mkdir()
    names: list[str] = []
    threads = [
        threading.Thread(target=lambda: names.append(fresh_run_name(tmp_path, "demo")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 8 and all((tmp_path / n).is_dir() for n in names)


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("lock") / "demo", 12, 0)


@pytest.mark.parametrize("command", ["run", "tune"])
def test_cli_refuses_a_locked_run_before_ray_starts(
    tmp_path, demo_root, capsys, command, monkeypatch
):
    from raytrain_vla.train import launch

    started: list[str] = []
    monkeypatch.setattr(run_cli, "init_ray", lambda *a, **k: started.append("run"))
    monkeypatch.setattr(launch, "init_ray", lambda *a, **k: started.append("tune"))
    storage = tmp_path / "runs"
    common = [f"--data.root={demo_root}", f"--ray.storage_path={storage}"]
    locked = storage / ("locked" if command == "run" else "lr_groups")
    holder = acquire(locked, "another driver")
    if command == "run":
        code = run_cli.main([*common, "--ray.run_name=locked"])
    else:
        code = tune_cli.main(["--space", "tune_spaces/lr_groups.yaml", *common])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "one driver per run" in err[0], err
    assert started == []  # refused before Ray would start
    assert json.loads((locked / LOCK_NAME).read_text())["token"] == holder["token"]
    release(locked, holder)
