"""A checkpoint directory a dead worker left on its node is removed by the next attempt; one of a
live process (another rank mid-save) is kept."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raytrain_vla.common.run_storage import local_scratch
from raytrain_vla.train.checkpoint_scratch import (
    checkpoint_scratch_root,
    new_checkpoint_directory,
    remove_orphaned_checkpoints,
)


@pytest.fixture(autouse=True)
def temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()


def _exited_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


def test_orphans_of_exited_processes_are_removed_and_live_ones_kept(tmp_path):
    run_dir = tmp_path / "runs" / "pick"
    mine = new_checkpoint_directory(run_dir, 3)
    assert mine.parent == checkpoint_scratch_root(run_dir)
    assert mine.name.startswith(f"pid{os.getpid()}-step3-")
    (mine / "__0_0.distcp").write_bytes(b"x" * 10)
    orphan = checkpoint_scratch_root(run_dir) / f"pid{_exited_pid()}-step6-abc"
    (orphan / "rng").mkdir(parents=True)
    (orphan / "rng" / "rank1.pt").write_bytes(b"y")
    unrelated = checkpoint_scratch_root(run_dir) / "notes"
    unrelated.mkdir()

    assert remove_orphaned_checkpoints(run_dir) == [orphan]
    assert not orphan.exists()
    assert (mine / "__0_0.distcp").read_bytes() == b"x" * 10
    assert unrelated.is_dir()
    assert remove_orphaned_checkpoints(run_dir) == []


def test_runs_of_one_name_in_two_storages_do_not_share_a_scratch_directory(tmp_path):
    first, second = tmp_path / "a" / "pick", tmp_path / "b" / "pick"
    assert local_scratch(first) != local_scratch(second)
    assert local_scratch(first).parent == Path(tempfile.gettempdir()) / "raytrain_vla"
    assert remove_orphaned_checkpoints(first) == []  # no scratch directory yet
