"""A bounded node-local cache of whole remote files (videos) shared by every process on a node.

LeRobot v3.0 concatenates many episodes into one video file per camera, so the read tasks of a
segment mostly read the same few files. Each file is downloaded once into `data.cache_dir`
(written to a temporary name, then renamed: concurrent readers never see a partial file),
read locally after that, and the least recently used files are deleted when the cache passes
`data.cache_max_gb`. A file larger than half the cache is read by byte range instead. Hits and
misses are counted per process and logged every `LOG_EVERY` lookups.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_EVERY = 200
log = logging.getLogger("raytrain_vla.data.object_cache")
_stats = {"hits": 0, "misses": 0, "bypassed": 0, "bytes_downloaded": 0}


@dataclass(frozen=True)
class CacheConfig:
    """Where and how much; `max_bytes` 0 turns the cache off (every read is by byte range)."""

    directory: str
    max_bytes: int

    @classmethod
    def from_gb(cls, directory: str, max_gb: float) -> CacheConfig:
        return cls(str(Path(directory).expanduser()), int(max_gb * 2**30))


def cache_stats() -> dict[str, float]:
    """This process's lookups: hits, misses, bypassed (too large), bytes downloaded, hit rate."""
    lookups = _stats["hits"] + _stats["misses"]
    return {**_stats, "hit_rate": _stats["hits"] / lookups if lookups else 0.0}


def local_copy(remote: Any, key: tuple, cache: CacheConfig | None) -> str | None:
    """A local path holding the bytes of `remote` (a UPath whose content `key` = (uri, size,
    version) identifies), or None when the file should be read by range instead."""
    if cache is None or cache.max_bytes <= 0:
        return None
    uri, size = str(key[0]), int(key[1])
    if size > cache.max_bytes // 2:
        _stats["bypassed"] += 1
        return None
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    directory = Path(cache.directory)
    target = directory / f"{digest}{Path(uri).suffix}"
    if target.is_file() and target.stat().st_size == size:
        os.utime(target)  # recently used: evicted last
        _count("hits")
        return str(target)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{digest}.{uuid.uuid4().hex[:8]}.part"
    try:
        remote.fs.get_file(remote.path, str(tmp))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _stats["bytes_downloaded"] += size
    _count("misses")
    _evict(directory, cache.max_bytes, keep=target)
    return str(target)


def _count(kind: str) -> None:
    _stats[kind] += 1
    lookups = _stats["hits"] + _stats["misses"]
    if lookups % LOG_EVERY == 0:
        s = cache_stats()
        log.info(
            "object cache (pid %d): hit rate %.0f%% (%d hits, %d misses), %.2f GB downloaded",
            os.getpid(), 100 * s["hit_rate"], s["hits"], s["misses"],
            s["bytes_downloaded"] / 2**30,
        )  # fmt: skip


def _evict(directory: Path, max_bytes: int, keep: Path) -> None:
    """Delete least recently used files until the cache fits (never `keep`, never a partial
    download of another process)."""
    entries = []
    for path in directory.iterdir():
        if path.name.startswith("."):
            continue
        try:
            st = path.stat()
        except FileNotFoundError:  # another process evicted it meanwhile
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        if path == keep:
            continue
        path.unlink(missing_ok=True)  # a process reading it keeps its open file
        total -= size
