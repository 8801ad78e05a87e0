"""`open_dataset(root, delta_timestamps)[i]` against the items LeRobot 0.6 itself returned.

The fixtures' `<name>_reference.npz` were written by `LeRobotDataset(root, delta_timestamps)[i]`
(torchcodec video backend); see `shared/fixtures/lerobot_v3/README.md`.
"""

from __future__ import annotations

import json
import pickle
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from _paths import fixtures_root

from raytrain_vla.data.formats.images import ImageRows, decode_images
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.random_access import LeRobotFrames, open_dataset

KEY = "observation.image"


def _reference(name: str) -> tuple[dict, np.lib.npyio.NpzFile]:
    root = fixtures_root() / "lerobot_v3"
    return json.loads((root / f"{name}_reference.json").read_text()), np.load(
        root / f"{name}_reference.npz"
    )


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
def test_items_match_lerobot_reference(name):
    ref, npz = _reference(name)
    ds = open_dataset(fixtures_root() / "lerobot_v3" / name, ref["delta_timestamps"])
    assert len(ds) == 120
    worst = 0.0
    for i in ref["indices"]:
        item = ds[i]
        want = {k.split("/", 1)[1] for k in npz.files if k.startswith(f"idx{i}/")}
        assert set(item) == want | {"task"}
        assert item["task"] == ref["task"][str(i)]
        for key in want:
            got, exp = item[key].numpy(), npz[f"idx{i}/{key}"]
            assert (got.shape, got.dtype) == (exp.shape, exp.dtype), key
            if key == KEY and name == "pusht_like":  # decoded video: within decoder tolerance
                worst = max(worst, float(np.abs(got - exp).max()))
            else:
                np.testing.assert_array_equal(got, exp, err_msg=f"idx{i}/{key}")
    assert worst <= 2 / 255, worst  # measured: 0 (PyAV and torchcodec agree on this AV1 file)


@pytest.mark.parametrize("name", ["pusht_like", "pusht_like_images"])
def test_items_without_windows_are_single_frames(name):
    ds = open_dataset(fixtures_root() / "lerobot_v3" / name)
    assert isinstance(ds, LeRobotFrames)
    item = ds[41]
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in item.items() if k != "task"}
    assert shapes == {
        KEY: ((3, 64, 64), torch.float32),
        "observation.state": ((2,), torch.float32),
        "action": ((2,), torch.float32),
        "timestamp": ((), torch.float32),
        **{k: ((), torch.int64) for k in ("frame_index", "episode_index", "index", "task_index")},
    }
    assert (int(item["index"]), int(item["episode_index"]), int(item["frame_index"])) == (41, 1, 1)
    assert item["task"] == "push the T to the left"
    _, npz = _reference(name)
    np.testing.assert_array_equal(item["action"].numpy(), npz["idx41/action"][0])
    assert float(np.abs(item[KEY].numpy() - npz[f"idx41/{KEY}"][1]).max()) <= 2 / 255


def test_bad_windows_and_indices_are_refused():
    root = fixtures_root() / "lerobot_v3" / "pusht_like_images"
    with pytest.raises(DatasetError, match=r"delta_timestamps\['action'\].*0\.05"):
        open_dataset(root, {"action": [0.0, 0.05]})
    with pytest.raises(IndexError, match="120"):
        open_dataset(root)[120]


def test_source_reads_image_features_like_lerobot():
    """Training's reader streams image features too; camera_keys include them."""
    _, npz = _reference("pusht_like_images")
    meta = LeRobotMeta.load(fixtures_root() / "lerobot_v3" / "pusht_like_images")
    source = LeRobotSource(meta, chunk_size=10)
    assert source.camera_keys == [KEY]
    ids = np.array([119, 0, 41, 39, 80])
    out = pickle.loads(pickle.dumps(source.reader(ids))).read()  # as Ray ships it
    assert out[f"image/{KEY}"].shape == (5, 3, 64, 64) and out[f"image/{KEY}"].dtype == np.uint8
    for row, i in enumerate(ids):
        img = out[f"image/{KEY}"][row].astype(np.float32) / 255
        np.testing.assert_array_equal(img, npz[f"idx{i}/{KEY}"][1])
        np.testing.assert_array_equal(out["actions"][row], npz[f"idx{i}/action"])
        np.testing.assert_array_equal(out["action_is_pad"][row], npz[f"idx{i}/action_is_pad"])


def _jpeg(img: np.ndarray) -> bytes:
    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height, ctx.pix_fmt = img.shape[1], img.shape[0], "yuvj444p"
    ctx.time_base = Fraction(1, 10)
    ctx.options = {"qscale": "2"}
    frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuvj444p")
    return b"".join(bytes(p) for p in ctx.encode(frame) + ctx.encode(None))


def test_decode_images_png_jpeg_and_errors():
    meta = LeRobotMeta.load(fixtures_root() / "lerobot_v3" / "pusht_like_images")
    png = ImageRows(meta).read(KEY, np.array([3]))[0]
    img = np.zeros((16, 24, 3), np.uint8)
    img[:, :12] = (200, 40, 90)
    out = decode_images([{"bytes": _jpeg(img), "path": None}, _jpeg(img)])
    assert out.shape == (2, 16, 24, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - img).max() <= 6  # JPEG is lossy
    assert png.shape == (64, 64, 3)
    with pytest.raises(DatasetError, match=r"cams.parquet: feature 'x', row 1 \(episode 7\)"):
        decode_images(
            [_jpeg(img), b"\x89PNG\r\n\x1a\ngarbage"], "cams.parquet: feature 'x'", [3, 7]
        )
    with pytest.raises(DatasetError, match="row 0.*not a PNG or JPEG"):
        decode_images([b"hello"])
