"""Episodes read back whole (`read_episodes`): what the writer was given, so that a dataset copied
episode by episode into a new one (`data metaworld --base`) is the same dataset."""

from __future__ import annotations

import json

import numpy as np

from raytrain_vla.data.formats.episodes import read_episodes
from raytrain_vla.data.formats.lerobot import LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)

FPS = 10
LENGTHS = (9, 4, 12)


def _episodes(extra: bool) -> list:
    rng = np.random.default_rng(3)
    out = []
    for i, t in enumerate(LENGTHS):
        y, x = np.mgrid[0:16, 0:24]
        base = np.stack([x * 9 + 20, y * 12 + 20, np.full_like(x, 90)], -1).astype(np.uint8)
        frames = np.repeat(base[None], t, 0)
        for k in range(t):  # a bright square that moves: every frame differs
            frames[k, 2:6, k : k + 4] = 240
        columns = {}
        if extra:
            columns = {
                "next.reward": rng.normal(size=t).astype(np.float32),
                "next.success": np.arange(t) == t - 1,
                "observation.environment_state": rng.normal(size=(t, 5)).astype(np.float32),
                "task_id": np.full(t, i, np.int16),
            }
        out.append(
            EpisodeData(
                {"observation.image": frames},
                rng.normal(size=(t, 3)).astype(np.float32),
                rng.normal(size=(t, 4)).astype(np.float32),
                f"task {i % 2}",
                columns,
            )  # fmt: skip
        )
    return out


def _assert_same_columns(got, want) -> None:
    assert got.task == want.task
    np.testing.assert_array_equal(got.state, want.state)
    np.testing.assert_array_equal(got.action, want.action)
    assert list(got.extra) == list(want.extra)
    for key, values in want.extra.items():
        assert got.extra[key].dtype == values.dtype, key
        np.testing.assert_array_equal(got.extra[key], values)


def test_png_episodes_read_back_bit_for_bit_and_copy_into_the_same_dataset(tmp_path):
    written = _episodes(extra=True)
    spec = DatasetSpec(FPS, images="png", channels_first=True, data_file_mb=1e-6)
    first = write_lerobot_dataset(tmp_path / "a", written, spec)  # one data file per episode
    read = list(read_episodes(first))
    assert len(read) == len(written)
    for got, want in zip(read, written, strict=True):
        _assert_same_columns(got, want)
        np.testing.assert_array_equal(
            got.cameras["observation.image"], want.cameras["observation.image"]
        )
    copy = write_lerobot_dataset(tmp_path / "b", read, spec)
    a, b = LeRobotMeta.load(first), LeRobotMeta.load(copy)
    columns = list(a.features)
    assert read_frames_table(a, columns).equals(read_frames_table(b, columns))
    stats = [json.loads((r / "meta/stats.json").read_text()) for r in (first, copy)]
    assert stats[0] == stats[1]


def test_video_episodes_read_back_frame_for_frame(tmp_path):
    written = _episodes(extra=False)
    spec = DatasetSpec(FPS, VideoSpec("libx264", 18, 2, "veryfast"), video_file_mb=1e-6)
    root = write_lerobot_dataset(tmp_path / "v", written, spec)  # the videos roll over too
    read = list(read_episodes(root))
    for got, want in zip(read, written, strict=True):
        _assert_same_columns(got, want)
        frames, source = got.cameras["observation.image"], want.cameras["observation.image"]
        assert frames.shape == source.shape and frames.dtype == np.uint8
        # lossy, yet each decoded frame is nearest its own source frame, in order
        err = np.abs(frames[:, None].astype(np.int16) - source[None]).mean(axis=(2, 3, 4))
        assert np.diag(err).max() < 5.0
        np.testing.assert_array_equal(err.argmin(1), np.arange(len(source)))
