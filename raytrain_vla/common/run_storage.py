"""Where a run's files live: a local directory, or a prefix in object storage
(`ray.storage_path=s3://bucket/runs`, any fsspec URI).

Object stores have no rename, no append and no O_EXCL, so the few operations a run needs that
differ are here, each a plain local call for a path (local behaviour is unchanged) and its
object-store equivalent for a URI: an exclusive create (a conditional PUT, `If-None-Match: *`),
whole-directory upload and download, a jsonl log rewritten whole, modification times from the
store's own clock. Listings are never cached: Ray Train writes checkpoints through pyarrow,
behind fsspec's back. Credentials and endpoint come from the store's standard variables
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from upath import UPath

from raytrain_vla.common.location import DataPath, is_uri

RunPath = DataPath  # a local Path, or a UPath on an object store


def run_path(value: str | os.PathLike | UPath) -> RunPath:
    """A UPath without listing cache for a URI (trailing `/` dropped), else the local path
    made absolute."""
    text = str(value)
    if is_uri(text):
        return UPath(text.rstrip("/"), use_listings_cache=False)
    return Path(text.removeprefix("file://")).expanduser().resolve()


def is_remote(path: RunPath | str) -> bool:
    return is_uri(str(path))


def local_scratch(run_dir: RunPath) -> Path:
    """This node's scratch directory for a run, in the temp directory: local stand-ins for
    files of a run in object storage, and its checkpoints before Ray uploads them. Keyed by the
    run's full path, so runs of the same name in different storage never share one."""
    key = hashlib.sha1(str(run_dir).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / "raytrain_vla" / f"{run_dir.name}-{key}"


def create_exclusive(path: RunPath, data: bytes) -> bool:
    """Create `path` holding `data` unless it exists (False then): O_CREAT|O_EXCL locally, a
    conditional PUT on an object store. The one atomic claim both offer."""
    if not is_remote(path):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True
    try:
        with path.fs.open(path.path, "xb") as f:
            f.write(data)
    except FileExistsError:
        return False
    return True


def _files(path: UPath) -> dict[str, dict]:
    """{key: info} of the objects under `path`, without the empty `dir/` markers pyarrow writes."""
    found = path.fs.find(path.path, detail=True)
    return {k: v for k, v in found.items() if v.get("type") == "file" and not k.endswith("/")}


def _mtime(info: dict) -> float:
    stamp = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp or 0.0)


def file_modified_at(path: RunPath) -> float | None:
    """The file's modification time on the clock of the storage that holds it; None if absent."""
    try:
        if not is_remote(path):
            return Path(path).stat().st_mtime
        return _mtime(path.fs.info(path.path))
    except FileNotFoundError:
        return None


def tree_modified_at(path: RunPath) -> float:
    """A directory's modification time: its own locally; on an object store (no directories)
    its oldest object's, i.e. when it started to appear."""
    if not is_remote(path):
        return Path(path).stat().st_mtime
    return min((_mtime(info) for info in _files(path).values()), default=0.0)


def subdirectories(path: RunPath, prefix: str) -> list[RunPath]:
    """Directories directly in `path` whose name starts with `prefix`, sorted by name."""
    if not is_remote(path):
        return sorted(p for p in Path(path).glob(f"{prefix}*") if p.is_dir())
    try:
        entries = path.fs.ls(path.path, detail=True)
    except FileNotFoundError:
        return []
    names = {
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"
    }
    return [path / n for n in sorted(names) if n.startswith(prefix)]


def remove_tree(path: RunPath) -> None:
    """Delete a directory and everything in it; a missing one is fine."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        path.fs.rm(path.path, recursive=True)
    except FileNotFoundError:
        pass


def upload_directory(
    local: Path, remote: UPath, last: tuple[str, ...] = (), replace: bool = True
) -> None:
    """Copy every file under `local` to `remote`, replacing objects of the same name and, with
    `replace`, removing the ones the new copy lacks. Files named in `last` go last: an object
    store has no rename, so the file readers check first is what marks the copy complete."""
    files = sorted(p for p in Path(local).rglob("*") if p.is_file())
    names = {p.relative_to(local).as_posix() for p in files}
    base = remote.path.rstrip("/")
    stale = [k for k in _files(remote) if k[len(base) + 1 :] not in names] if replace else []
    files.sort(key=lambda p: p.name in last)
    for p in files:
        remote.fs.put_file(str(p), f"{base}/{p.relative_to(local).as_posix()}")
    for key in stale:
        remote.fs.rm_file(key)


def download_directory(remote: UPath, local: Path) -> Path:
    """Copy every object under `remote` into `local` (created); FileNotFoundError naming
    `remote` when nothing is there."""
    files = _files(remote)
    if not files:
        raise FileNotFoundError(f"{remote}: no such directory (no objects under it)")
    base = remote.path.rstrip("/") + "/"
    for key in files:
        target = Path(local) / key[len(base) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        remote.fs.get_file(key, str(target))
    return Path(local)


@contextmanager
def local_directory(path: RunPath | str) -> Iterator[Path]:
    """`path` itself when local; else a temporary local copy of it, removed afterwards (for
    readers that need files: torch DCP, safetensors, the manifest's checksums)."""
    if not is_remote(path):
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="raytrain_vla-") as tmp:
        remote = run_path(path)
        yield download_directory(remote, Path(tmp) / remote.name)


class JsonlLog:
    """A jsonl file a single writer adds records to (metrics, sample ids).

    Locally each record is appended and flushed at once, as before. An object store cannot
    append: the object is read when the log opens (a resumed attempt keeps what earlier ones
    wrote), records collect in memory and `flush` rewrites the whole object, at most every
    `flush_every_s` on `write` and always on `flush`/`close`. Callers flush before a checkpoint
    is reported, so a killed attempt loses at most lines of steps after its last checkpoint,
    which the next attempt redoes. One writer per log at a time (the run's driver lock and
    Ray Train's restart of the whole worker group ensure it).
    """

    def __init__(self, path: RunPath, flush_every_s: float = 0.0):
        self.path, self.flush_every_s = path, flush_every_s
        self.remote = is_remote(path)
        self._text, self._dirty, self._flushed = "", False, time.monotonic()
        if self.remote and path.exists():
            self._text = path.read_text()
            if self._text and not self._text.endswith("\n"):
                self._text += "\n"

    def write(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        if not self.remote:
            with Path(self.path).open("a") as f:
                f.write(line)
            return
        self._text += line
        self._dirty = True
        if time.monotonic() - self._flushed >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        if self.remote and self._dirty:
            self.path.write_text(self._text)
            self._dirty, self._flushed = False, time.monotonic()

    close = flush
