"""DCP's file writer: written pages flushed and dropped from the page cache as it goes, and each
file's CRC32 computed on the way out.

A checkpoint is written once and not read back by the run that wrote it, yet a plain write
leaves every byte of it in the page cache: gigabytes of freshly allocated pages per save, taken
from the same free memory the step loop allocates its activations from, and evicting the
dataset's cached files. Here each file is flushed to disk (`fdatasync`) and its pages released
(`POSIX_FADV_DONTNEED`) every `chunk_bytes`, so a save of any size recycles a few chunks of page
cache. On this 2-CPU VM, with the changes below, it took the training time a background save
costs from 0.575 to 0.178 of a synchronous save with a CPU idle, and from 0.944 to 0.624 with
both training; checksumming in pieces then took the first to a median of 0.126
(benchmarks/README.md, "Checkpoint stall"). The files are DCP's, loaded as before.

The manifest needs every file's CRC32. Reading a just-written checkpoint back for it would
allocate the page cache the writes avoided (and cost a second pass), so the stream computes it
from the bytes it writes and records it, with the file's size and mtime, in an extended attribute
of the file (`recorded_digest`). Only the manifest's writer trusts it; verification reads.

A large write (torch.save hands over a whole tensor's bytes at once) goes out in `piece_bytes`
pieces, each checksummed right after the kernel copied it into the page cache, while it is still
in the CPU's cache: the CRC32 then reads no memory the copy had not just read. Checksumming a
whole tensor after writing it read every staged byte from memory twice, traffic the step loop on
the other CPU competes with (benchmarks/README.md, "Checkpoint stall").
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

CHUNK_BYTES = 64 << 20
PIECE_BYTES = 256 << 10  # half of a core's L2 cache on common x86 parts
_DROPS = hasattr(os, "posix_fadvise")  # Linux and most Unixes; elsewhere a plain write
_DIGEST_XATTR = "user.raytrain_vla.digest"

try:  # torch 2.6 and later
    from torch.utils.serialization import config as _serialization_config
except ImportError:
    _serialization_config = None


def recorded_digest(path: Path) -> dict[str, int] | None:
    """The size and CRC32 a `WriteBehindStream` recorded when it wrote `path`, or None when
    there is none (another writer, a file system without user xattrs) or the file has changed
    since (its size or mtime differ)."""
    try:
        recorded = json.loads(os.getxattr(path, _DIGEST_XATTR))
        stat = path.stat()
    except (OSError, AttributeError, ValueError):  # AttributeError: no xattrs on this OS
        return None
    if recorded.get("size") != stat.st_size or recorded.get("mtime_ns") != stat.st_mtime_ns:
        return None
    return {"size": recorded["size"], "crc32": recorded["crc32"]}


class WriteBehindStream(io.RawIOBase):
    """A binary file opened for writing whose written pages leave the page cache behind it."""

    def __init__(
        self,
        file: io.BufferedWriter,
        chunk_bytes: int = CHUNK_BYTES,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        super().__init__()
        self.file = file
        self.chunk_bytes = chunk_bytes
        self.piece_bytes = piece_bytes
        self.dropped_to = 0  # pages before this offset are on disk and out of the cache
        self.crc32 = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, self.piece_bytes):
            piece = view[start : start + self.piece_bytes]
            self.file.write(piece)  # buffered and blocking: all of it, or it raises
            self.crc32 = zlib.crc32(piece, self.crc32)
            self.size += piece.nbytes
            if self.file.tell() - self.dropped_to >= self.chunk_bytes:
                self._drop()
        return view.nbytes

    def tell(self) -> int:
        return self.file.tell()

    def fileno(self) -> int:
        return self.file.fileno()

    def flush(self) -> None:
        if not self.file.closed:
            self.file.flush()

    def close(self) -> None:
        if not self.closed and not self.file.closed:
            self._drop()
            self._record_digest()
            self.file.close()
        super().close()

    def _record_digest(self) -> None:
        stat = os.fstat(self.file.fileno())
        if stat.st_size != self.size:  # not written by this stream alone (opened to append)
            return
        digest = {"size": self.size, "crc32": self.crc32, "mtime_ns": stat.st_mtime_ns}
        try:
            os.setxattr(self.file.fileno(), _DIGEST_XATTR, json.dumps(digest).encode())
        except (OSError, AttributeError):
            pass  # no user xattrs here: the manifest's writer reads the file instead

    def _drop(self) -> None:
        self.file.flush()
        if not _DROPS:
            return
        end = self.file.tell()
        os.fdatasync(self.file.fileno())  # dirty pages cannot be dropped
        os.posix_fadvise(self.file.fileno(), self.dropped_to, end - self.dropped_to,
                         os.POSIX_FADV_DONTNEED)  # fmt: skip
        self.dropped_to = end


class WriteBehindFileSystem(FileSystem):
    """DCP's local file system, whose write streams are `WriteBehindStream`s."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        super().__init__()
        self.chunk_bytes = chunk_bytes

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[Any, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with WriteBehindStream(Path(path).open(mode), self.chunk_bytes) as stream:
            yield stream


def lower_cpu_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19): a background writer then
    takes the cycles the step loop leaves idle (collective waits, data loading) instead of
    sharing the training cores equally with it. Irreversible without privileges, so only for
    threads that do nothing else."""
    if hasattr(os, "setpriority"):
        os.setpriority(os.PRIO_PROCESS, 0, 19)  # on Linux: this thread


class WriteBehindWriter(FileSystemWriter):
    """`FileSystemWriter` (one file per rank, fsynced) over `WriteBehindFileSystem`.

    `background`: the writing thread is a background save's own (DCP's checkpoint process), so
    it drops to the lowest CPU priority before it writes."""

    def __init__(
        self,
        path: str | os.PathLike,
        background: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        self.fs = WriteBehindFileSystem(chunk_bytes)
        self.path = self.fs.init_path(path)
        self.background = background

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.background:
            lower_cpu_priority()
        with _no_record_crc32():  # the stream's CRC32 covers every byte of the file
            return super().write_data(plan, planner)


@contextmanager
def _no_record_crc32() -> Generator[None, None, None]:
    """`torch.save` without its zip records' CRC32s (a second pass over every byte, about a
    third of its time), where torch has the switch (2.6 and later)."""
    save_config = getattr(_serialization_config, "save", None)
    if not hasattr(save_config, "compute_crc32"):
        yield
        return
    before, save_config.compute_crc32 = save_config.compute_crc32, False
    try:
        yield
    finally:
        save_config.compute_crc32 = before
