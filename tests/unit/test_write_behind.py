"""DCP's writer with write-behind: the same checkpoint, its CRC32s recorded on the way out."""

from __future__ import annotations

import io
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from raytrain_vla.policy.integrity import file_digest
from raytrain_vla.train.manifest import digest_directory
from raytrain_vla.train.write_behind import WriteBehindStream, WriteBehindWriter, recorded_digest


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(300, 70, generator=g), "b": torch.arange(9)},
        "optimizer": {"step": 4, "exp_avg": torch.randn(300, 70, generator=g)},
    }


def save(directory, chunk_bytes: int = 4096) -> None:
    writer = WriteBehindWriter(directory, chunk_bytes=chunk_bytes)  # several drops per file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DCP: "assuming a single process"
        dcp.save(state(), storage_writer=writer, no_dist=True)


def test_the_checkpoint_loads_back_and_every_recorded_digest_is_the_files(tmp_path):
    save(tmp_path)
    files = sorted(p for p in tmp_path.iterdir() if p.is_file())
    assert {p.name for p in files} == {".metadata", "__0_0.distcp"}
    for path in files:
        assert recorded_digest(path) == file_digest(path)
    loaded = {
        "model": {"w": torch.zeros(300, 70), "b": torch.zeros(9, dtype=torch.long)},
        "optimizer": {"step": 0, "exp_avg": torch.zeros(300, 70)},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(loaded, checkpoint_id=str(tmp_path), no_dist=True)
    want = state()
    assert torch.equal(loaded["model"]["w"], want["model"]["w"])
    assert torch.equal(loaded["optimizer"]["exp_avg"], want["optimizer"]["exp_avg"])
    assert loaded["optimizer"]["step"] == 4
    # torch.save's own record CRC32s are off only while DCP writes
    assert torch.utils.serialization.config.save.compute_crc32 is True


def test_a_file_changed_after_writing_is_read_again(tmp_path):
    save(tmp_path)
    shard = tmp_path / "__0_0.distcp"
    (tmp_path / "rng.pt").write_bytes(b"written by another writer")
    with open(shard, "r+b") as f:  # same size, other bytes, a newer mtime
        f.seek(100)
        f.write(b"\x00\x01\x02")
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert recorded_digest(shard) is None and recorded_digest(tmp_path / "rng.pt") is None
    digests = digest_directory(tmp_path)
    assert digests["__0_0.distcp"] == file_digest(shard)
    assert digests["rng.pt"] == file_digest(tmp_path / "rng.pt")


def test_the_stream_drops_behind_it_and_cannot_seek(tmp_path):
    with WriteBehindStream((tmp_path / "f").open("wb"), chunk_bytes=1000) as stream:
        for _ in range(5):
            stream.write(b"x" * 700)
        assert stream.dropped_to == 2800  # flushed and dropped at 1400 and 2800
        with pytest.raises(io.UnsupportedOperation):
            stream.seek(0)
    assert recorded_digest(tmp_path / "f") == file_digest(tmp_path / "f")
    assert file_digest(tmp_path / "f")["size"] == 3500


def test_one_large_write_goes_out_in_pieces_and_drops_inside_it(tmp_path):
    """A whole tensor's bytes in one write: checksummed piece by piece (the same CRC32 as the
    file's) and dropped every chunk, not only once the write returns."""
    data = bytes(range(256)) * 14  # 3584 bytes
    checksummed: list[int] = []

    class Recording(WriteBehindStream):
        def _drop(self) -> None:
            checksummed.append(self.size)  # bytes checksummed when the drop came
            super()._drop()

    with Recording((tmp_path / "f").open("wb"), chunk_bytes=1000, piece_bytes=300) as stream:
        assert stream.write(memoryview(data)) == len(data)
    assert checksummed == [1200, 2400, 3584, 3584]  # 3 inside the one write, 1 at close
    assert (tmp_path / "f").read_bytes() == data
    assert recorded_digest(tmp_path / "f") == file_digest(tmp_path / "f")
