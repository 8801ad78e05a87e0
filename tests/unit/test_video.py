"""Video encode/decode: colour fidelity, timestamp matching, and errors that name the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _paths import fixtures_root

from raytrain_vla.data.formats.video import VideoDecodeError, decode_frames, encode_video
from raytrain_vla.sim import simulator as sim

FPS = 10


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([sim.rollout_expert(rng, 32).images for _ in range(3)])


@pytest.fixture(scope="module")
def video(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "v.mp4"
    encode_video(path, frames, FPS)
    return path


def test_round_trip_colours_close(frames, video):
    out = decode_frames(video, np.arange(len(frames)) / FPS)
    assert out.shape == frames.shape and out.dtype == np.uint8
    err = np.abs(out.astype(np.int16) - frames)
    # yuv420p shares chroma over 2x2 pixels, so disc edges differ; flat areas are near exact
    assert err.mean() < 4.0
    assert np.median(err) <= 2
    assert err.reshape(len(frames), -1).mean(1).max() < 6.0


def test_encode_leaves_no_temp_files(video):
    assert [p.name for p in video.parent.iterdir()] == ["v.mp4"]


def test_unsorted_and_repeated_timestamps(frames, video):
    full = decode_frames(video, np.arange(len(frames)) / FPS)
    ts = [1.2, 0.1, 1.2, 0.0, 0.5, 0.1]
    out = decode_frames(video, ts)
    np.testing.assert_array_equal(out, full[[12, 1, 12, 0, 5, 1]])


def test_far_apart_timestamps_reseek(tmp_path):
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, size=(60, 16, 16, 3), dtype=np.uint8)
    path = tmp_path / "long.mp4"
    encode_video(path, frames, FPS)
    full = decode_frames(path, np.arange(60) / FPS)
    np.testing.assert_array_equal(decode_frames(path, [5.9, 0.0, 3.0, 0.1]), full[[59, 0, 30, 1]])


def test_near_timestamps_snap_within_tolerance(frames, video):
    full = decode_frames(video, [0.3])
    np.testing.assert_array_equal(decode_frames(video, [0.3 + 0.02]), full)
    with pytest.raises(VideoDecodeError):
        decode_frames(video, [0.3 + 0.02], tolerance_s=1e-4)


def test_timestamp_past_end_names_file(frames, video):
    end = len(frames) / FPS + 1.0
    with pytest.raises(VideoDecodeError, match="v.mp4") as info:
        decode_frames(video, [0.0, end])
    assert f"{end:.6g}" in str(info.value)
    assert f"{(len(frames) - 1) / FPS:.6g}" in str(info.value)  # the nearest frame found


def test_truncated_and_missing_files_name_the_file(video, tmp_path):
    cut = tmp_path / "cut.mp4"
    data = video.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoDecodeError, match="cut.mp4"):
        decode_frames(cut, [0.0])
    with pytest.raises(VideoDecodeError, match="nope.mp4"):
        decode_frames(tmp_path / "nope.mp4", [0.0])
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video" * 100)
    with pytest.raises(VideoDecodeError, match="garbage.mp4"):
        decode_frames(garbage, [0.0])


def test_fixture_av1_matches_lerobot_reference():
    """LeRobot's own items (decoded with torchcodec) for the AV1 fixture video, exactly."""
    root = fixtures_root() / "lerobot_v3"
    ref = json.loads((root / "pusht_like_reference.json").read_text())
    npz = np.load(root / "pusht_like_reference.npz")
    video = root / "pusht_like/videos/observation.image/chunk-000/file-000.mp4"
    episode_len, episode_start = 40, {0: 0.0, 1: 4.0, 2: 8.0}  # from the fixture's metadata
    worst = 0.0
    for i in ref["indices"]:
        ep, fi = int(npz[f"idx{i}/episode_index"]), int(npz[f"idx{i}/frame_index"])
        deltas = ref["delta_timestamps"]["observation.image"]
        # LeRobot clamps out-of-episode queries to the episode's first/last frame (and pads)
        frame_ids = [min(max(fi + round(d * FPS), 0), episode_len - 1) for d in deltas]
        ts = [episode_start[ep] + f / FPS for f in frame_ids]
        got = decode_frames(video, ts, tolerance_s=1e-4).astype(np.float32) / 255
        want = npz[f"idx{i}/observation.image"].transpose(0, 2, 3, 1)
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 2 / 255, worst
