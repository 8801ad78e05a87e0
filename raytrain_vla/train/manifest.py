"""A checkpoint's manifest: every file's size and CRC32, written last, verified before loading.

Ray Train merges the ranks' staging directories into one checkpoint, so each rank digests the
files it wrote and rank 0 writes them all as `manifest.json`, after everything else. A resume
verifies the files (each rank a share, any world size) before DCP, json or torch reads them: a
truncated shard, a garbage sidecar or a missing RNG file is then named in one line and the run
falls back to the previous complete checkpoint instead of failing, or loading it silently.
The check itself is `policy.integrity`'s, which `export` and `policy.load` run too.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from raytrain_vla.common.atomic import write_text_atomic
from raytrain_vla.policy.integrity import MANIFEST, checkpoint_problems, file_digest
from raytrain_vla.train.write_behind import recorded_digest

__all__ = ["MANIFEST", "all_problems", "checkpoint_problems", "digest_directory", "write_manifest"]


def digest_directory(directory: Path) -> dict[str, dict[str, int]]:
    """Every file under `directory` (but a manifest), by its path relative to it: the digest
    its writer recorded (DCP's shards), else read from the file."""
    return {
        p.relative_to(directory).as_posix(): recorded_digest(p) or file_digest(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(
    directory: Path,
    rank: int,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Collective (over `group`, default the world) when a process group is up: rank 0 writes
    every rank's digests."""
    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier(group=group)  # every rank's files are final (ranks may share one directory)
    mine = digest_directory(directory)
    parts: list = [mine]
    if distributed:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine, group=group)
    if rank == 0:
        files: dict[str, dict[str, int]] = {}
        for part in parts:
            files.update(part or {})
        write_text_atomic(directory / MANIFEST, json.dumps({"version": 1, "files": files}))


def all_problems(directory: Path, rank: int, world_size: int) -> list[str]:
    """Collective: every rank verifies its share and learns everyone's verdict."""
    mine = checkpoint_problems(directory, rank, world_size)
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    parts: list[list[str] | None] = [None] * world_size
    dist.all_gather_object(parts, mine)
    return [p for part in parts for p in (part or [])]
