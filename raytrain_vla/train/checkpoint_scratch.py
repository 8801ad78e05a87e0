"""Where each rank assembles a checkpoint before Ray Train moves it into the run, and the clean-up
of those a dead worker left behind.

A rank writes its shards and sidecars into a fresh directory, reports it, and the directory is
deleted once Ray has taken its files into the run (synchronous saves) or uploaded them
(background saves). For a run on a local or mounted filesystem that directory is inside the run
(`<run>/.scratch/<host>/checkpoints/`), so Ray's upload is a rename (`move_into`) whatever disk
the run is on: a checkpoint's bytes are written once, not written and then copied. For a run in
object storage it is in the node's temp directory. A worker killed between writing and
reporting leaves the directory behind: a whole shard of model and optimizer state, tens of GB
for a 3.5B-parameter model, once per fault. So the directories are named after the process
that writes them, and every rank of a new attempt removes those whose process is gone. Owners
are told apart by pid, which only their node can check, hence one directory per host on a
filesystem that nodes may share. A directory of a live process (another rank on the node,
mid-save) is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import psutil

from raytrain_vla.common.run_storage import RunPath, is_remote, local_scratch

_OWNER = re.compile(r"^pid(\d+)-")
SCRATCH = ".scratch"  # a local run's unfinished checkpoints, one subdirectory per host


def checkpoint_scratch_root(run_dir: RunPath) -> Path:
    """This host's directory for unfinished checkpoints of `run_dir`: inside a run on a
    filesystem (the same one as its checkpoints, so they are handed over by rename), else in the
    node's temp directory."""
    if is_remote(run_dir):
        return local_scratch(run_dir) / "checkpoints"
    return Path(run_dir) / SCRATCH / socket.gethostname() / "checkpoints"


def new_checkpoint_directory(run_dir: RunPath, step: int) -> Path:
    """An empty directory for this process's checkpoint of `step`."""
    root = checkpoint_scratch_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"pid{os.getpid()}-step{step}-", dir=root))


def remove_orphaned_checkpoints(run_dir: RunPath) -> list[Path]:
    """Delete the checkpoint directories on this node whose writing process has exited; return
    them. Ranks on one node may run this at once: a directory already gone is not an error."""
    root = checkpoint_scratch_root(run_dir)
    removed = []
    for directory in sorted(root.iterdir()) if root.is_dir() else []:
        owner = _OWNER.match(directory.name)
        if owner is None or psutil.pid_exists(int(owner.group(1))):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    return removed


def move_into(directory: Path, destination: Path) -> bool:
    """Move every file of `directory` into `destination` (created if needed) by rename, when
    both are on one filesystem; False, with nothing moved, when they are not. Rank files merge
    into one checkpoint directory as Ray's copy merges them."""
    if os.stat(directory).st_dev != os.stat(destination.parent).st_dev:
        return False
    destination.mkdir(exist_ok=True)
    for source in sorted(directory.rglob("*")):
        target = destination / source.relative_to(directory)
        if source.is_dir():
            target.mkdir(exist_ok=True)
        else:
            os.replace(source, target)
    return True
