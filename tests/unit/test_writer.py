"""The generic LeRobot v3.0 writer: two cameras, both codecs, consistent metadata, real frames."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot import LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.video import decode_frames
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)

FPS = 15
CAMS = {"observation.images.top": (24, 40), "observation.images.wrist": (32, 32)}
LENGTHS = (18, 7, 25)
CODECS = {
    "av1": VideoSpec("libsvtav1", crf=30, gop=2, preset=12),  # LeRobot's default
    "h264": VideoSpec("libx264", crf=18, gop=10, preset="veryfast"),
}


def _frames(rng: np.random.Generator, t: int, h: int, w: int) -> np.ndarray:
    """A smooth colour gradient with a moving bright square: easy on lossy codecs."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 200 // w + 20, y * 200 // h + 20, np.full_like(x, 90)], -1)
    out = np.repeat(base[None], t, 0).astype(np.uint8)
    oy, ox = rng.integers(0, h - 6), rng.integers(0, w - 6)
    for i in range(t):
        cy, cx = (oy + i) % (h - 6), (ox + 2 * i) % (w - 6)
        out[i, cy : cy + 6, cx : cx + 6] = 240
    return out


def _episodes(seed: int = 0) -> list[EpisodeData]:
    rng = np.random.default_rng(seed)
    eps = []
    for i, t in enumerate(LENGTHS):
        cams = {k: _frames(rng, t, h, w) for k, (h, w) in CAMS.items()}
        state = rng.normal(size=(t, 3)).astype(np.float32)
        action = rng.normal(size=(t, 4)).astype(np.float32)
        eps.append(EpisodeData(cams, state, action, f"task {i % 2}"))
    return eps


@pytest.fixture(scope="module", params=list(CODECS))
def written(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVT_LOG", "1")  # SVT-AV1's banner would flood the test log
        spec = DatasetSpec(FPS, CODECS[request.param], robot_type="unit", state_names=list("xyz"))
        root = write_lerobot_dataset(
            tmp_path_factory.mktemp(request.param) / "ds", _episodes(), spec
        )
    return request.param, root


def test_metadata_consistent(written):
    codec, root = written
    meta = LeRobotMeta.load(root)
    starts = np.cumsum((0, *LENGTHS))[:-1]
    assert meta.version == "v3.0" and meta.fps == FPS
    assert meta.num_episodes == len(LENGTHS) and meta.total_frames == sum(LENGTHS)
    np.testing.assert_array_equal(meta.episode_length, LENGTHS)
    np.testing.assert_array_equal(meta.episode_from_index, starts)
    assert meta.video_keys == list(CAMS) and meta.state_dim == 3 and meta.action_dim == 4
    assert sorted(meta.tasks) == ["task 0", "task 1"]
    info = json.loads((root / "meta/info.json").read_text())
    for key, (h, w) in CAMS.items():
        assert meta.camera_shape(key) == (3, h, w)
        vinfo = info["features"][key]["info"]
        assert (vinfo["video.codec"], vinfo["video.g"]) == (codec, CODECS[codec].gop)
        assert (vinfo["video.height"], vinfo["video.width"]) == (h, w)
        assert meta.video_file(key, 2) == meta.video_file(key, 0)  # one concatenated file
        for e, s in enumerate(starts):
            assert meta.video_from_timestamp(key, e) == pytest.approx(s / FPS)
        assert np.shape(meta.stats[key]["mean"]) == (3, 1, 1)
    assert info["features"]["observation.state"]["names"] == ["x", "y", "z"]
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("stats/observation.state/count").to_pylist() == [[n] for n in LENGTHS]


def test_low_dim_columns_round_trip(written):
    _, root = written
    meta = LeRobotMeta.load(root)
    eps = _episodes()
    table = read_frames_table(meta, ["observation.state", "action", "timestamp", "task_index"])
    np.testing.assert_array_equal(
        to_numpy(table["observation.state"]), np.concatenate([e.state for e in eps])
    )
    np.testing.assert_array_equal(
        to_numpy(table["action"]), np.concatenate([e.action for e in eps])
    )
    ts = np.concatenate([np.arange(n) / FPS for n in LENGTHS])
    np.testing.assert_allclose(to_numpy(table["timestamp"]), ts, atol=1e-6)
    want_mean = np.concatenate([e.action for e in eps]).mean(0)
    np.testing.assert_allclose(meta.stats["action"]["mean"], want_mean, atol=1e-6)


def test_frames_round_trip(written):
    _, root = written
    meta = LeRobotMeta.load(root)
    for key in CAMS:
        for e, ep in enumerate(_episodes()):
            ts = meta.video_from_timestamp(key, e) + np.arange(LENGTHS[e]) / FPS
            got = decode_frames(meta.video_file(key, e), ts, tolerance_s=1e-4).astype(np.int16)
            # (decoded, written) mean abs error: lossy, yet each frame is nearest its own source
            err = np.abs(got[:, None] - ep.cameras[key][None]).mean(axis=(2, 3, 4))
            assert np.diag(err).max() < 5.0, (key, e, np.diag(err).max())
            np.testing.assert_array_equal(err.argmin(1), np.arange(LENGTHS[e]))


def test_random_access_equals_sequential_decode(written):
    """Scattered, repeated, unsorted timestamps decode to exactly the sequential frames."""
    _, root = written
    meta = LeRobotMeta.load(root)
    key = list(CAMS)[0]
    path = meta.video_file(key, 0)
    every = np.arange(sum(LENGTHS)) / FPS
    full = decode_frames(path, every)
    rng = np.random.default_rng(1)
    for _ in range(5):
        pick = rng.choice(len(every), size=12)
        jitter = rng.uniform(-0.4, 0.4, size=12) / FPS
        np.testing.assert_array_equal(decode_frames(path, every[pick] + jitter), full[pick])


def test_a_channels_first_decode_is_the_rgb_decode_transposed(written):
    """Decoding straight into (N, 3, H, W) gives exactly the (N, H, W, 3) pixels, transposed,
    with and without a resize as the frames are decoded, for a width (40) that is not a
    multiple of 32; the result is contiguous."""
    _, root = written
    meta = LeRobotMeta.load(root)
    every = np.arange(sum(LENGTHS)) / FPS
    pick = np.random.default_rng(2).choice(len(every), size=20)  # scattered, with repeats
    for key in CAMS:
        path = meta.video_file(key, 0)
        for size in (None, (16, 20)):
            want = decode_frames(path, every[pick], size=size).transpose(0, 3, 1, 2)
            got = decode_frames(path, every[pick], size=size, channels_first=True)
            assert got.flags.c_contiguous
            np.testing.assert_array_equal(got, want, err_msg=f"{key} {size}")


def test_source_reads_both_cameras(written):
    _, root = written
    source = LeRobotSource(LeRobotMeta.load(root), chunk_size=4)
    out = source.read(np.array([22, 0, 19, 49]))
    for key, (h, w) in CAMS.items():
        assert out[f"image/{key}"].shape == (4, 3, h, w)
    # episode 1 is frames 18..24 and episode 2 ends at 49: chunks past an end are padding
    assert out["action_is_pad"][[0, 3]].tolist() == [[False] * 3 + [True], [False] + [True] * 3]


def test_rejects_inconsistent_episodes_and_overwrite(tmp_path, written):
    eps = _episodes()
    eps[1].cameras.pop("observation.images.wrist")
    with pytest.raises(ValueError, match="episode 1"):
        write_lerobot_dataset(tmp_path / "a", eps, DatasetSpec(FPS))
    eps = _episodes()
    eps[2].action = eps[2].action[:-1]
    with pytest.raises(ValueError, match="episode 2"):
        write_lerobot_dataset(tmp_path / "b", eps, DatasetSpec(FPS))
    assert not any(tmp_path.iterdir())  # nothing half-written
    _, root = written
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        write_lerobot_dataset(root, _episodes(), DatasetSpec(FPS))


def test_streamed_files_roll_over_at_their_size_and_read_back(tmp_path):
    """Files past `data_file_mb` / `video_file_mb` close and the next episode opens the next
    file, as LeRobot's writer rolls them; every frame still reads back from its own file."""
    eps = _episodes()
    spec = DatasetSpec(FPS, CODECS["h264"], data_file_mb=1e-6, video_file_mb=1e-6)
    root = write_lerobot_dataset(tmp_path / "ds", eps, spec)
    meta = LeRobotMeta.load(root)
    assert len(list((root / "data").rglob("*.parquet"))) == len(LENGTHS)
    table = read_frames_table(meta, ["action", "episode_index"])
    np.testing.assert_array_equal(
        to_numpy(table["action"]), np.concatenate([e.action for e in eps])
    )
    for key in CAMS:
        # the encoder holds its look-ahead frames, so a 7-frame episode may not show in bytes yet
        files = [meta.video_file(key, e) for e in range(len(LENGTHS))]
        assert files[1] != files[0] and len(set(files)) >= 2
        assert meta.video_from_timestamp(key, 1) == 0
    out = LeRobotSource(meta, chunk_size=1).read(np.array([20, 30]))  # episodes 1 and 2
    for key in CAMS:
        got = out[f"image/{key}"].astype(np.int16)  # (2, 3, H, W), lossy
        want = np.stack([eps[1].cameras[key][2], eps[2].cameras[key][5]]).transpose(0, 3, 1, 2)
        assert np.abs(got - want).mean() < 5.0


def test_png_frames_and_extra_columns_as_lerobot_stores_them(tmp_path):
    """LeRobot's `dtype: image` (PNG cells, lossless, here channels-first as the hub's
    Meta-World data) and further per-frame columns: scalars, bools, int16 and vectors."""
    eps = _episodes()
    for e in eps:
        t = len(e.state)
        e.extra = {
            "next.reward": np.linspace(0, 1, t, dtype=np.float32),
            "next.success": np.arange(t) == t - 1,
            "observation.environment_state": np.ones((t, 5), np.float32) * t,
            "task_id": np.full(t, 7, np.int16),
        }
    names = {"observation.state": {"axes": None}, "observation.environment_state": ["kp"]}
    spec = DatasetSpec(FPS, images="png", channels_first=True, names=names, robot_type="mw")
    root = write_lerobot_dataset(tmp_path / "ds", eps, spec)
    meta = LeRobotMeta.load(root)
    info = json.loads((root / "meta/info.json").read_text())
    feats = info["features"]
    assert meta.image_keys == list(CAMS) and meta.video_keys == [] and info["video_path"] is None
    assert feats["observation.images.top"]["shape"] == [3, 24, 40]
    assert meta.camera_shape("observation.images.top") == (3, 24, 40)
    assert [feats[k]["dtype"] for k in eps[0].extra] == ["float32", "bool", "float32", "int16"]
    assert feats["next.reward"]["shape"] == [1] and feats["observation.environment_state"][
        "shape"
    ] == [5]
    assert feats["observation.state"]["names"] == {"axes": None}
    assert feats["observation.environment_state"]["names"] == ["kp"]
    schema = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    assert json.loads(schema.metadata[b"huggingface"])["info"]["features"][
        "observation.images.top"
    ] == {"_type": "Image"}
    table = read_frames_table(meta, list(eps[0].extra))
    for key in eps[0].extra:
        np.testing.assert_array_equal(
            to_numpy(table[key])
            .reshape(sum(LENGTHS), -1)
            .squeeze(-1 if key != "observation.environment_state" else None),
            np.concatenate([e.extra[key] for e in eps]),
        )
    assert set(meta.stats) >= set(eps[0].extra)
    out = LeRobotSource(meta, chunk_size=1).read(np.array([20, 0]))
    for key in CAMS:
        want = np.stack([eps[1].cameras[key][2], eps[0].cameras[key][0]]).transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(out[f"image/{key}"], want)  # PNG: lossless
