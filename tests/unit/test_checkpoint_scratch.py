"""A checkpoint directory a dead worker left on its node is removed by the next attempt; one of a
live process (another rank mid-save) is kept. A finished one is renamed into local run storage,
not copied: a local run's checkpoints are assembled on its own filesystem."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from raytrain_vla.common.run_storage import local_scratch
from raytrain_vla.train.checkpoint_scratch import (
    checkpoint_scratch_root,
    move_into,
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


def test_a_local_run_assembles_checkpoints_on_its_own_filesystem_per_host(tmp_path):
    """With the temp directory on another device than the run (`/tmp` on the root disk, runs on
    NVMe), a checkpoint assembled for a local run still moves into it by rename; a run in object
    storage assembles in the temp directory."""
    from upath import UPath

    shm = Path("/dev/shm")
    run_dir = tmp_path / "runs" / "pick"
    run_dir.mkdir(parents=True)
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another device than the test's temp directory")
    with tempfile.TemporaryDirectory(dir=shm) as other_device:
        tempfile.tempdir = other_device  # restored by the autouse fixture
        directory = new_checkpoint_directory(run_dir, 3)
        (directory / "__0_0.distcp").write_bytes(b"x")
        assert directory.is_relative_to(run_dir / ".scratch" / socket.gethostname())
        assert move_into(directory, run_dir / "checkpoint_a")
        assert (run_dir / "checkpoint_a" / "__0_0.distcp").read_bytes() == b"x"
        remote = checkpoint_scratch_root(UPath("s3://bucket/runs/pick"))
        assert remote.is_relative_to(other_device)


def _two_ranks_of_one_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    rank0 = tmp_path / "scratch" / "rank0"
    rank1 = tmp_path / "scratch" / "rank1"
    for rank, directory in enumerate((rank0, rank1)):
        (directory / "rng").mkdir(parents=True)
        (directory / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 1000)
        (directory / "rng" / f"rank{rank}.pt").write_bytes(b"rng")
    (rank0 / "train_state.json").write_text("{}")
    return rank0, rank1


def test_rank_directories_move_into_one_checkpoint_by_rename(tmp_path):
    rank0, rank1 = _two_ranks_of_one_checkpoint(tmp_path)
    inode = os.stat(rank1 / "__1_0.distcp").st_ino
    destination = tmp_path / "run" / "checkpoint_a"
    destination.parent.mkdir()
    assert move_into(rank0, destination) and move_into(rank1, destination)
    names = sorted(str(p.relative_to(destination)) for p in destination.rglob("*"))
    assert names == [
        "__0_0.distcp", "__1_0.distcp", "rng", "rng/rank0.pt", "rng/rank1.pt", "train_state.json"
    ]  # fmt: skip
    assert os.stat(destination / "__1_0.distcp").st_ino == inode  # renamed, not copied
    assert not [p for p in rank0.rglob("*") if p.is_file()]


def test_nothing_moves_across_filesystems(tmp_path, monkeypatch):
    rank0, _ = _two_ranks_of_one_checkpoint(tmp_path)
    destination = tmp_path / "run" / "checkpoint_a"
    destination.parent.mkdir()
    real_stat = os.stat

    def stat_on_another_device(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if Path(path) == destination.parent:
            return os.stat_result((*result[:2], result.st_dev + 1, *result[3:]))
        return result

    monkeypatch.setattr(os, "stat", stat_on_another_device)
    assert not move_into(rank0, destination)
    assert not destination.exists() and (rank0 / "__0_0.distcp").is_file()


def test_ray_train_upload_renames_into_local_run_storage(tmp_path, monkeypatch):
    """The function Ray Train calls to upload a rank's checkpoint, with Ray's own storage
    context: the files are renamed into the run and the checkpoint Ray registers points there."""
    import ray.train
    from ray.train.v2._internal.execution.storage import StorageContext

    from raytrain_vla.train import worker

    storage = StorageContext(str(tmp_path / "runs"), "pick")
    monkeypatch.setattr(
        ray.train, "get_context", lambda: type("Ctx", (), {"get_storage": lambda self: storage})()
    )
    rank0, _ = _two_ranks_of_one_checkpoint(tmp_path)
    inode = os.stat(rank0 / "__0_0.distcp").st_ino
    persisted = worker._into_storage(ray.train.Checkpoint.from_directory(rank0), "checkpoint_a")
    assert Path(persisted.path) == tmp_path / "runs" / "pick" / "checkpoint_a"
    assert persisted.filesystem == storage.storage_filesystem
    assert os.stat(Path(persisted.path) / "__0_0.distcp").st_ino == inode
