"""A training checkpoint's files checked against its `manifest.json` (every file's size and
CRC32, written last by `train.manifest`), before anything reads them.

Resume, `export` and `policy.load` all check here, so a truncated shard or a garbage sidecar is
named in one line instead of surfacing as DCP's traceback or, worse, as silently wrong weights.
It lives below `train` so that `policy.load` (which must not import the trainer) checks too.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

MANIFEST = "manifest.json"
_BLOCK = 1 << 22


class CheckpointFilesDamaged(ValueError):
    """A checkpoint file is missing or differs from its manifest."""


def file_digest(path: Path) -> dict[str, int]:
    """Size and CRC32, read in blocks: a shard may be larger than memory allows at once."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return {"size": size, "crc32": crc}


def checkpoint_problems(
    directory: Path,
    rank: int = 0,
    world_size: int = 1,
    checksums: bool = True,
    shown_as: str | None = None,
) -> list[str]:
    """What is wrong with this rank's share of the checkpoint's files ([] when sound).

    A checkpoint without a manifest predates manifests (a registered checkpoint always has
    one: it is written before the checkpoint is reported) and is taken as it is. `shown_as`
    names the directory in the problems (the URI of a downloaded copy).
    """
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return []
    try:
        files = json.loads(manifest.read_text())["files"]
        names = sorted(files)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [
            f"{_join(shown_as, directory, MANIFEST)}: unreadable ({' '.join(str(err).split())})"
        ]
    problems = []
    for name in names[rank::world_size]:
        path, want, label = directory / name, files[name], _join(shown_as, directory, name)
        if not path.is_file():
            problems.append(f"{label}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{label}: {size} bytes, the manifest says {want['size']}")
        elif checksums and file_digest(path)["crc32"] != want["crc32"]:
            problems.append(f"{label}: contents differ from the manifest (CRC32)")
    return problems


def _join(shown_as: str | None, directory: Path, name: str) -> str:
    return f"{shown_as.rstrip('/')}/{name}" if shown_as else str(directory / name)


def verify_checkpoint(directory: Path, shown_as: str | None = None) -> None:
    """Raise `CheckpointFilesDamaged` naming the first damaged file (and how many more), in one
    line, when any file differs from the manifest in size or checksum."""
    problems = checkpoint_problems(Path(directory), shown_as=shown_as)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointFilesDamaged(
            f"{problems[0]}{more}: checkpoint damaged (its files must match its {MANIFEST}); "
            "use an earlier checkpoint of the run"
        )
