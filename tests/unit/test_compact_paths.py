"""Read tasks name their files as patterns and numbers, and get the same strings back."""

from __future__ import annotations

import pickle

from raytrain_vla.data.formats.compact_paths import CompactPaths


def test_paths_come_back_exactly_as_given():
    paths = [
        "/data/robot 7/videos/observation.images.cam1/chunk-000/file-012.mp4",
        "/data/robot 7/videos/observation.images.cam1/chunk-001/file-000.mp4",
        "s3://bucket-2/videos/chunk-999/observation.images.front/episode_000123.mp4",
        "s3://bucket-2/videos/chunk-1000/observation.images.front/episode_1000000.mp4",
        "/odd/{braces}/0/00/9" + "7" * 25 + "/file-{:03d}-5.mp4",  # a digit run too long for int64
        "/no/digits/here.mp4",
        "",
    ]
    compact = CompactPaths.of(paths)
    assert list(compact) == paths and len(compact) == len(paths)
    assert compact[-1] == "" and compact[1:3] == paths[1:3]
    assert list(pickle.loads(pickle.dumps(compact))) == paths


def test_many_files_cost_a_few_bytes_each_not_their_strings():
    root = "s3://a-long-bucket-name-of-some-team/datasets/some_robot/v3"
    paths = [
        f"{root}/videos/observation.images.front/chunk-{f // 1000:03d}/file-{f % 1000:03d}.mp4"
        for f in range(0, 5000, 3)
    ]
    compact = CompactPaths.of(paths)
    assert len(compact.patterns) == 1 and list(compact) == paths
    strings, packed = len(pickle.dumps(paths)), len(pickle.dumps(compact))
    assert packed * 10 < strings, (packed, strings)
    assert packed / len(paths) < 12  # four small numbers a file (v3, chunk, file, mp4)
