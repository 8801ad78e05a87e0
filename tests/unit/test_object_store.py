"""A LeRobot dataset on an S3-compatible server reads exactly as the same files on disk.

The server is moto's, on 127.0.0.1, reached through the AWS environment variables; the reads
are real HTTP range requests by s3fs and pyarrow.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from _paths import fixtures_root

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from s3_server import S3Server  # noqa: E402

from raytrain_vla.common.location import as_path  # noqa: E402
from raytrain_vla.data.formats.lerobot import (  # noqa: E402
    DatasetError,
    LeRobotMeta,
    dataset_fingerprint,
)
from raytrain_vla.data.formats.lerobot_source import LeRobotSource  # noqa: E402

NAMES = ("pusht_like", "pusht_like_images")


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def copies(s3):
    local = {n: fixtures_root() / "lerobot_v3" / n for n in NAMES}
    return {n: (local[n], s3.upload(local[n], n)) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_a_dataset_on_s3_reads_as_on_disk(copies, name):
    local, uri = copies[name]
    a, b = LeRobotMeta.load(local), LeRobotMeta.load(uri)
    assert str(b.root) == uri and b.tasks == a.tasks and b.fps == a.fps
    for key in a.episodes:
        np.testing.assert_array_equal(a.episodes[key], b.episodes[key])
    # the same files give the same fingerprint: a run may move its data to a bucket and resume
    assert dataset_fingerprint(b) == dataset_fingerprint(a)
    ids = np.array([119, 0, 41, 39, 80, 41])
    want = LeRobotSource(a, chunk_size=10).read(ids)
    got = LeRobotSource(b, chunk_size=10).read(ids)
    assert list(got) == list(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_a_missing_dataset_on_s3_names_the_uri(s3):
    uri = "s3://raytrain-vla-test/nothing-here"
    with pytest.raises(DatasetError, match=f"{uri}/meta/info.json: missing"):
        LeRobotMeta.load(uri)


def test_a_video_missing_on_s3_is_named_at_open(copies, s3):
    import s3fs

    local, uri = copies["pusht_like"]
    broken = s3.upload(local, "broken")
    video = next(
        p for p in s3fs.S3FileSystem().find(broken.removeprefix("s3://")) if p.endswith(".mp4")
    )
    s3fs.S3FileSystem().rm(video)
    with pytest.raises(DatasetError, match="video file missing"):
        LeRobotSource(LeRobotMeta.load(broken), chunk_size=10)


def test_a_uri_data_root_and_a_uri_storage_path_are_kept_as_typed():
    from raytrain_vla.config import absolute_paths, load_config

    cfg = absolute_paths(
        load_config(
            None, ["--data.root=s3://bucket/datasets/arm/", "--ray.storage_path=s3://bucket/runs/"]
        )
    )
    assert cfg.data.root == "s3://bucket/datasets/arm"
    assert cfg.ray.storage_path == "s3://bucket/runs"


def test_shards_convert_into_s3_from_s3_and_read_as_the_dataset(copies, tmp_path):
    """Shards written from the bucket's copy into the bucket equal shards written on disk, and
    train reads from them give the LeRobot source's columns; the prefix then is refused."""
    from raytrain_vla.data.formats.shards import ShardSource, convert_to_shards
    from raytrain_vla.data.formats.shards.manifest import MANIFEST

    local, uri = copies["pusht_like"]
    out = uri.replace("pusht_like", f"shards-{tmp_path.name}")
    kwargs = {"chunk_size": 10, "samples_per_shard": 50, "row_group_size": 16, "use_ray": False}
    remote = convert_to_shards(uri, out, **kwargs)
    on_disk = convert_to_shards(local, tmp_path / "shards", **kwargs)
    assert remote["shards"] == on_disk["shards"] and len(remote["shards"]) > 1  # same bytes
    assert remote["source_fingerprint"] == on_disk["source_fingerprint"]
    assert as_path(out).joinpath(MANIFEST).is_file()
    ids = np.array([119, 0, 41, 39, 80, 41, 99])
    want = LeRobotSource(LeRobotMeta.load(local), chunk_size=10).read(ids)
    got = ShardSource(out, 10).read(ids)
    assert list(got) == list(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    with pytest.raises(FileExistsError, match=f"{out} already exists and is not empty"):
        convert_to_shards(local, out, **kwargs)


def test_a_failed_conversion_into_s3_leaves_nothing_behind(copies, tmp_path, monkeypatch):
    """Two shards are uploaded, the third fails: the prefix is emptied, so a second try is not
    refused and no reader sees shards without their manifest."""
    from raytrain_vla.data.formats.shards import convert

    local, uri = copies["pusht_like"]
    out = uri.replace("pusht_like", f"failed-{tmp_path.name}")
    real = convert.write_shard

    def failing(path, *args, **kwargs):
        if path.name == "shard-00002.parquet":
            raise OSError("disk full")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(convert, "write_shard", failing)
    kwargs = {"chunk_size": 10, "samples_per_shard": 50, "use_ray": False}
    with pytest.raises(OSError, match="disk full"):
        convert.convert_to_shards(local, out, **kwargs)
    assert not as_path(out).exists()
    monkeypatch.setattr(convert, "write_shard", real)
    assert len(convert.convert_to_shards(local, out, **kwargs)["shards"]) == 3  # 120 frames


def test_the_node_cache_downloads_a_video_once_and_stays_within_its_size(copies, tmp_path):
    from raytrain_vla.common.object_cache import CacheConfig, cache_stats
    from raytrain_vla.data.formats.video import decode_frames

    local, uri = copies["pusht_like"]
    meta = LeRobotMeta.load(uri)
    key = meta.video_keys[0]
    video = str(meta.video_file(key, 0))
    size = as_path(video).stat().st_size
    cache = CacheConfig(str(tmp_path / "cache"), max_bytes=3 * size)
    want = decode_frames(str(LeRobotMeta.load(local).video_file(key, 0)), [0.0, 0.5, 1.0])
    before = cache_stats()
    for _ in range(3):
        np.testing.assert_array_equal(decode_frames(video, [0.0, 0.5, 1.0], cache=cache), want)
    after = cache_stats()
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 2
    assert after["bytes_downloaded"] - before["bytes_downloaded"] == size
    # more files than fit: the least recently used go, the cache stays within its size
    small = CacheConfig(str(tmp_path / "small"), max_bytes=int(2.5 * size))
    for name in ("c1", "c2", "c3"):
        copy = s3_copy_of(copies, name)
        decode_frames(str(LeRobotMeta.load(copy).video_file(key, 0)), [0.0], cache=small)
    held = [p for p in (tmp_path / "small").iterdir() if not p.name.startswith(".")]
    assert len(held) == 2 and sum(p.stat().st_size for p in held) <= small.max_bytes
    # a file larger than half the cache is read by byte range, not copied
    tiny = CacheConfig(str(tmp_path / "tiny"), max_bytes=size)
    bypassed = cache_stats()["bypassed"]
    decode_frames(video, [0.0], cache=tiny)
    assert cache_stats()["bypassed"] == bypassed + 1 and not (tmp_path / "tiny").exists()


def s3_copy_of(copies, name: str) -> str:
    """Another object with the same bytes (a different key, so a different cache entry)."""
    import s3fs

    _, uri = copies["pusht_like"]
    fs = s3fs.S3FileSystem()
    src, dst = uri.removeprefix("s3://"), f"raytrain-vla-test/{name}"
    if not fs.exists(dst):
        fs.copy(src, dst, recursive=True)
    return f"s3://{dst}"


def test_a_negative_cache_size_is_refused():
    from raytrain_vla.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'data.cache_max_gb': -1.0, expected GiB >= 0"):
        load_config(None, ["--data.cache_max_gb=-1"])
