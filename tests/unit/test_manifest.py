"""Checkpoint manifests: sizes and CRC32s written last, every damage named before a load."""

from __future__ import annotations

import json

import pytest
from test_resume import make_checkpoint, register

from raytrain_vla.config import load_config
from raytrain_vla.train.manifest import MANIFEST, checkpoint_problems, write_manifest
from raytrain_vla.train.resume import CheckpointDamaged, check_resume


def checkpoint(run_dir, name: str, step: int) -> None:
    """A checkpoint's file layout: shards, RNG per rank, sidecars; then its manifest."""
    make_checkpoint(run_dir, name, step)
    directory = run_dir / name
    for rank in (0, 1):
        (directory / f"__{rank}_0.distcp").write_bytes(bytes(range(256)) * (rank + 3))
        (directory / "rng").mkdir(exist_ok=True)
        (directory / "rng" / f"rank{rank}.pt").write_bytes(b"rng" * (rank + 1))
    (directory / "scheduler.json").write_text("{}")
    write_manifest(directory, rank=0)


def test_a_sound_checkpoint_has_no_problems_and_ranks_share_the_files(tmp_path):
    checkpoint(tmp_path, "checkpoint_1", 3)
    files = json.loads((tmp_path / "checkpoint_1" / MANIFEST).read_text())["files"]
    assert set(files) == {
        "__0_0.distcp", "__1_0.distcp", "rng/rank0.pt", "rng/rank1.pt", "scheduler.json",
        "train_state.json",
    }  # fmt: skip
    assert checkpoint_problems(tmp_path / "checkpoint_1") == []
    (tmp_path / "checkpoint_1" / "__1_0.distcp").write_bytes(b"")
    shares = [checkpoint_problems(tmp_path / "checkpoint_1", r, 3) for r in range(3)]
    assert sum(len(s) for s in shares) == 1  # each file checked by exactly one of 3 ranks


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "__1_0.distcp").write_bytes(b"\0" * 10), "__1_0.distcp: 10 bytes, the"),
        (lambda d: (d / "rng" / "rank1.pt").unlink(), "rng/rank1.pt: missing"),
        (lambda d: (d / "train_state.json").write_text("garbage!" * 40), "train_state.json: "),
        (lambda d: (d / "scheduler.json").write_text("[]"), "scheduler.json: contents differ"),
        (lambda d: (d / MANIFEST).write_text("{"), f"{MANIFEST}: unreadable"),
    ],
)
def test_every_damage_is_named(tmp_path, damage, expected):
    checkpoint(tmp_path, "checkpoint_1", 3)
    damage(tmp_path / "checkpoint_1")
    problems = checkpoint_problems(tmp_path / "checkpoint_1")
    assert len(problems) == 1 and expected in problems[0], problems


@pytest.mark.parametrize("train_state", ["garbage", "{}", "[1, 2]"])
def test_resume_falls_back_to_the_newest_sound_checkpoint(tmp_path, train_state):
    checkpoint(tmp_path, "checkpoint_1", 3)
    checkpoint(tmp_path, "checkpoint_2", 6)
    register(tmp_path, ["checkpoint_1", "checkpoint_2"])
    (tmp_path / "checkpoint_2" / "train_state.json").write_text(train_state)
    (tmp_path / "checkpoint_2" / MANIFEST).unlink()  # even without a manifest to tell
    assert check_resume(load_config(), tmp_path, "fingerprint") == tmp_path / "checkpoint_1"


def test_a_run_whose_every_checkpoint_is_damaged_is_refused_naming_the_file(tmp_path):
    checkpoint(tmp_path, "checkpoint_1", 3)
    register(tmp_path, ["checkpoint_1"])
    shard = tmp_path / "checkpoint_1" / "__0_0.distcp"
    shard.write_bytes(b"x")
    with pytest.raises(
        CheckpointDamaged, match=f"no complete checkpoint to resume from \\({shard}"
    ):
        check_resume(load_config(), tmp_path, "fingerprint")
