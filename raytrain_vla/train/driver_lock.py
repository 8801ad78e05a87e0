"""One driver per run directory (a training run or a sweep), on local disk, on shared mounts and
in object storage.

Two drivers on one run would both pass the resume check, then rewrite the same Ray snapshot and
prune each other's uploads. The lock is a file created with O_CREAT|O_EXCL, which is atomic on
local file systems and on NFSv4/EFS, or on an object store an object created by a conditional
PUT (`If-None-Match: *`), holding who owns it. A lock whose owner is gone (same host, process
dead or its pid reused) is taken over with a message; a lock from another host cannot be
checked from here, so the user is told who holds it and how to break it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from raytrain_vla.common.run_storage import (
    RunPath,
    create_exclusive,
    file_modified_at,
    is_remote,
    run_path,
)

LOCK_NAME = ".driver.lock"


class DriverLocked(ValueError):
    """Another live driver (or one this host cannot check) holds the run directory."""


def _process_start(pid: int) -> float | None:
    """When process `pid` started, or None when no such process runs."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:  # another user's live process
        return -1.0


def _owner_record(what: str) -> dict:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _process_start(pid),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500],
        "what": what,
        "token": uuid.uuid4().hex,
    }


def _read(path: RunPath) -> dict | None:
    """The lock's owner record; None if the lock vanished; {} if it is unreadable."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _owner_is_gone(owner: dict) -> bool:
    """True only when this host can prove the owner process no longer runs."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    started = _process_start(owner["pid"])
    if started is None:
        return True
    recorded = owner.get("pid_start")
    # A different start time means the pid was reused by an unrelated process.
    return started >= 0 and isinstance(recorded, float) and abs(started - recorded) > 1.0


def _describe(owner: dict) -> str:
    if not owner:
        return "an unreadable lock"
    return (
        f"{owner.get('what', 'a driver')} pid {owner.get('pid')} on host {owner.get('host')} "
        f"since {owner.get('started')} ({owner.get('command', '?')})"
    )


def _try_create(path: RunPath, record: dict) -> bool:
    return create_exclusive(path, json.dumps(record).encode())


def _take_over(path: RunPath, stale: dict) -> bool:
    """Move the stale lock aside; False when another driver changed it first."""
    if is_remote(path):
        return _take_over_remote(path, stale)
    aside = path.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if _read(aside) != stale:  # raced: we moved a fresh lock; put it back unless replaced
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True


def _take_over_remote(path: RunPath, stale: dict) -> bool:
    """An object store has no rename: the takeover of a stale lock is claimed by creating a
    marker named by its token, exclusively, so one driver alone deletes it. The marker stays
    (a few bytes), so a driver that read the stale lock late cannot claim it again and delete
    the winner's lock."""
    marker = path.with_name(f"{LOCK_NAME}.takeover-{stale.get('token', 'unreadable')}")
    if not create_exclusive(marker, json.dumps(_owner_record("takeover")).encode()):
        return False
    if _read(path) != stale:  # released and taken meanwhile: not ours to delete
        return False
    path.unlink(missing_ok=True)
    return True


def acquire(directory: RunPath | str, what: str) -> dict:
    """Lock `directory` for this process; return the record to pass to `release`."""
    directory = run_path(directory) if is_remote(directory) else directory
    if not is_remote(directory):
        directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    record = _owner_record(what)
    for _ in range(5):
        if _try_create(path, record):
            return record
        owner = _read(path)
        if owner is None:
            continue  # released meanwhile
        if owner and _owner_is_gone(owner):
            if _take_over(path, owner):
                print(
                    f"note: {directory}: taking over the lock of a driver that is gone "
                    f"({_describe(owner)})",
                    file=sys.stderr,
                )
            continue
        raise DriverLocked(
            f"{directory}: in use by {_describe(owner)}; one driver per run. Wait for it, or "
            f"use another name. If that driver is gone (another host cannot be checked from "
            f"here), delete {path} and start again"
        )
    raise DriverLocked(f"{path}: the lock kept changing while taking it; start again")


def release(directory: RunPath | str, record: dict) -> None:
    """Remove the lock if it is still this driver's (a takeover by another may have happened)."""
    path = (run_path(directory) if is_remote(directory) else directory) / LOCK_NAME
    owner = _read(path)
    if owner and owner.get("token") == record["token"]:
        path.unlink(missing_ok=True)


def lock_taken_at(directory: RunPath) -> float | None:
    """When the driver holding `directory` took its lock (the file's mtime, on the clock of the
    file system that also stamps the checkpoints); None when no driver holds it."""
    return file_modified_at(directory / LOCK_NAME)


@contextmanager
def driver_lock(directory: RunPath | str, what: str) -> Iterator[None]:
    record = acquire(directory, what)
    try:
        yield
    finally:
        release(directory, record)
