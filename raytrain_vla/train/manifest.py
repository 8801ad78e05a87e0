"""A checkpoint's manifest: every file's size and CRC32, written last, verified before loading.

Ray Train merges the ranks' staging directories into one checkpoint, so each rank digests the
files it wrote and rank 0 writes them all as `manifest.json`, after everything else. A resume
verifies the files (each rank a share, any world size) before DCP, json or torch reads them: a
truncated shard, a garbage sidecar or a missing RNG file is then named in one line and the run
falls back to the previous complete checkpoint instead of failing, or loading it silently.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch.distributed as dist

from raytrain_vla.common.atomic import write_text_atomic

MANIFEST = "manifest.json"
_BLOCK = 1 << 22


def file_digest(path: Path) -> dict[str, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return {"size": size, "crc32": crc}


def digest_directory(directory: Path) -> dict[str, dict[str, int]]:
    """Every file under `directory` (but a manifest), by its path relative to it."""
    return {
        p.relative_to(directory).as_posix(): file_digest(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(directory: Path, rank: int) -> None:
    """Collective when a process group is up: rank 0 writes every rank's digests."""
    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier()  # every rank's files are final (ranks may share one directory)
    mine = digest_directory(directory)
    parts: list = [mine]
    if distributed:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    if rank == 0:
        files: dict[str, dict[str, int]] = {}
        for part in parts:
            files.update(part or {})
        write_text_atomic(directory / MANIFEST, json.dumps({"version": 1, "files": files}))


def checkpoint_problems(
    directory: Path, rank: int = 0, world_size: int = 1, checksums: bool = True
) -> list[str]:
    """What is wrong with this rank's share of the checkpoint's files ([] when sound).

    A checkpoint without a manifest predates manifests (a registered checkpoint always has
    one: it is written before the checkpoint is reported) and is taken as it is.
    """
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return []
    try:
        files = json.loads(manifest.read_text())["files"]
        names = sorted(files)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{manifest}: unreadable ({' '.join(str(err).split())})"]
    problems = []
    for name in names[rank::world_size]:
        path, want = directory / name, files[name]
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{path}: {size} bytes, the manifest says {want['size']}")
        elif checksums and file_digest(path)["crc32"] != want["crc32"]:
            problems.append(f"{path}: contents differ from the manifest (CRC32)")
    return problems


def all_problems(directory: Path, rank: int, world_size: int) -> list[str]:
    """Collective: every rank verifies its share and learns everyone's verdict."""
    mine = checkpoint_problems(directory, rank, world_size)
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    parts: list[list[str] | None] = [None] * world_size
    dist.all_gather_object(parts, mine)
    return [p for part in parts for p in (part or [])]
