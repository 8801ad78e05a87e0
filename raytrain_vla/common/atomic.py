"""Write a directory atomically: build it in a hidden sibling, rename it into place at the end.

An interrupted write never leaves a half dataset or export, and an existing non-empty target is
refused (or, for exports, replaced only once the new one is complete). Every file is fsynced
before the rename, and the rename itself after, so a power cut cannot leave a complete-looking
directory of empty files.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from upath import UPath

from raytrain_vla.common.location import as_path, is_uri


def refuse_non_empty(target: Path | UPath) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already exists and is not empty; refusing to overwrite it")


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `target`; on success it becomes `target`, else it is removed."""
    refuse_non_empty(target)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_tree(tmp)
        if target.exists():
            target.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, target)
        fsync_directory(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def replacing_directory(target: Path) -> Iterator[Path]:
    """Like `atomic_directory`, but an existing `target` is replaced (an export written again):
    it is swapped out only once the new one is complete."""
    target = Path(target)
    staging = target.with_name(f".{target.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        fsync_tree(staging)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
        fsync_directory(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step, durably: a crash leaves the old file or the new
    one, never a truncated mix (checkpoint sidecars, exports, stats)."""
    if is_uri(path):  # an object-store PUT replaces the object in one step already
        as_path(path).write_text(text)
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_directory(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory, deepest first."""
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(Path(directory))


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: some filesystems refuse it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
