"""Where dataset files live: a local path, or an object-store URI (`s3://`, `gs://`, any fsspec
protocol) read through universal_pathlib's `UPath`, which has the pathlib API we use.

Credentials and endpoints come from each store's standard configuration: for S3,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION` and `AWS_ENDPOINT_URL`, as
boto3 and pyarrow read them, so one command works against AWS, MinIO or a local test server.
Files are read in byte ranges (parquet row groups, video packets): no node copies a dataset.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow.parquet as pq
from upath import UPath

from raytrain_vla.common import uri

DataPath = Path | UPath  # a local Path or a UPath on an object store
RANGE_BLOCK_BYTES = 4 << 20  # bytes a remote read fetches at a time (a few GOPs of video)


def is_uri(value: str | os.PathLike | UPath) -> bool:
    """True for `scheme://...` other than `file://` (the config's own test, on any path)."""
    return uri.is_uri(value)


def as_path(value: str | os.PathLike | UPath) -> DataPath:
    """A UPath for a URI, else a local Path with `~` expanded."""
    if isinstance(value, UPath) and is_uri(value):
        return value
    text = str(value)
    if is_uri(text):
        return UPath(text)
    return Path(text.removeprefix("file://")).expanduser()


def is_remote(path: DataPath | str) -> bool:
    return is_uri(path)


def join_inside(root: DataPath, relative: str) -> tuple[DataPath, bool]:
    """`root / relative` normalised lexically, and whether it stays inside `root` (no `..`
    escapes, no absolute path): the check works alike for paths and URIs."""
    norm = posixpath.normpath(relative.replace(os.sep, "/"))
    inside = not (norm == ".." or norm.startswith("../") or posixpath.isabs(norm))
    if not is_remote(root):
        return Path(os.path.normpath(Path(root) / norm)), inside
    return root / norm, inside


_STAT: dict[str, tuple] = {}


def file_key(path: DataPath | str) -> tuple:
    """(path, size, version) identifying a file's content for per-process caches. Remote files
    are stat'ed once per process: datasets do not change under a run (the fingerprint says)."""
    text = str(path)
    if not is_uri(text):
        st = os.stat(text)
        return (text, st.st_size, st.st_mtime_ns)
    if text not in _STAT:
        info = as_path(text).stat()
        _STAT[text] = (text, info.st_size, getattr(info, "st_mtime", 0))
    return _STAT[text]


def open_binary(path: DataPath | str) -> IO[bytes] | str:
    """Something PyAV opens: the local path itself, or a seekable remote file that fetches
    `RANGE_BLOCK_BYTES` at a time (close it after use)."""
    p = as_path(path)
    if not is_remote(p):
        return str(p)
    return p.fs.open(p.path, "rb", block_size=RANGE_BLOCK_BYTES, cache_type="readahead")


@contextmanager
def open_container(path: DataPath | str, cache: Any = None) -> Iterator[Any]:
    """`av.open` on a local path, a node-local copy of a remote file (`cache`, an
    object_cache.CacheConfig), or a ranged remote file; closes what it opened."""
    import av

    from raytrain_vla.common.object_cache import local_copy

    source: Any = None
    if cache is not None and is_remote(path):
        copy = local_copy(as_path(path), file_key(path), cache)
        if copy is not None:
            try:
                source = open(copy, "rb")  # held open: a concurrent eviction cannot take it
            except FileNotFoundError:
                source = None
    if source is None:
        source = open_binary(path)
    try:
        with av.open(source) as container:
            yield container
    finally:
        if not isinstance(source, str):
            source.close()


def parquet_file(path: DataPath | str, **kwargs: Any) -> pq.ParquetFile:
    """A ParquetFile that reads row groups by byte range, locally or remotely."""
    p = as_path(path)
    if not is_remote(p):
        return pq.ParquetFile(str(p), **kwargs)
    kwargs.pop("memory_map", None)
    return pq.ParquetFile(p.path, filesystem=p.fs, **kwargs)


def read_table(path: DataPath | str, columns: list[str] | None = None):
    p = as_path(path)
    if not is_remote(p):
        return pq.read_table(str(p), columns=columns)
    return pq.read_table(p.path, filesystem=p.fs, columns=columns)


def read_schema_names(path: DataPath | str) -> list[str]:
    return parquet_file(path).schema_arrow.names


def sizes_under(root: DataPath) -> dict[str, int]:
    """{relative posix path: bytes} of every file under `root` whose path has no hidden part."""
    out: dict[str, int] = {}
    if is_remote(root):
        base = root.path.rstrip("/") + "/"
        for name, info in root.fs.find(root.path, detail=True).items():
            rel = name[len(base) :] if name.startswith(base) else name
            if info.get("type") == "file" and not any(p.startswith(".") for p in rel.split("/")):
                out[rel] = int(info["size"])
        return out
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        base = Path(directory).relative_to(root)
        for n in names:
            if not n.startswith("."):
                out[(base / n).as_posix()] = (Path(directory) / n).stat().st_size
    return out
