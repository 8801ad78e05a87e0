"""Normalisation modes, resizing, keyed augmentation and the read-task transform: no Ray."""

import numpy as np
import pytest
import torch

from raytrain_vla.common.image_ops import resize_images
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.config.schema import AugmentConfig
from raytrain_vla.data.augment import augment_images
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.processor import FlowVLAProcessor
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.train.inputs import ReadTransform

STATS = {
    "observation.state": {
        "mean": [1.0, 2.0],
        "std": [2.0, 0.5],
        "min": [-3, 0],
        "max": [5, 4],
        "q01": [-2, 1],
        "q99": [4, 3],
    },
    "action": {"mean": [0.0], "std": [1.0], "min": [-1], "max": [3], "q01": [-0.5], "q99": [2.5]},
}


@pytest.mark.parametrize(
    "mode, lo, hi",
    [("min_max", "min", "max"), ("quantile", "q01", "q99")],
)
def test_range_modes_map_their_range_to_unit_interval(mode, lo, hi):
    norm = Normalizer.from_stats(STATS, mode)
    for feat, s in STATS.items():
        edges = torch.tensor([s[lo], s[hi]], dtype=torch.float32)
        torch.testing.assert_close(
            norm.normalize(feat, edges), torch.tensor([[-1.0] * len(s[lo]), [1.0] * len(s[lo])])
        )


def test_mean_std_and_per_feature_override_round_trip():
    norm = Normalizer.from_stats(STATS, "mean_std", {"action": "quantile"})
    assert norm.modes == {"observation.state": "mean_std", "action": "quantile"}
    x = torch.tensor([[3.0, 2.5]])
    torch.testing.assert_close(norm.normalize("observation.state", x), torch.tensor([[1.0, 1.0]]))
    again = Normalizer.from_dict(norm.to_dict())
    y = torch.randn(4, 1)
    torch.testing.assert_close(again.unnormalize("action", again.normalize("action", y)), y)


def test_missing_stat_names_feature_and_mode():
    stats = {
        "observation.state": {"mean": [0.0], "std": [1.0]},
        "action": {"mean": [0.0], "std": [1.0]},
    }
    with pytest.raises(ValueError, match=r"'action' has no \['q01', 'q99'\].*'quantile'"):
        Normalizer.from_stats(stats, "mean_std", {"action": "quantile"}, source="x/stats.json")


def _images(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"image/cam": rng.integers(0, 256, size=(n, 3, 16, 16), dtype=np.uint8)}


def test_augmentation_is_keyed_to_sample_and_epoch_not_batch():
    cfg = AugmentConfig(brightness=0.2, contrast=0.2, max_shift_px=2)
    imgs = _images()
    ids, epochs = np.array([7, 8, 9, 10]), np.array([0, 0, 1, 1])
    whole = augment_images(imgs, ids, epochs, 3, cfg)["image/cam"]
    # Any batching of the same (id, epoch) pairs gives the same pixels.
    parts = [
        augment_images(
            {"image/cam": imgs["image/cam"][i : i + 1]}, ids[i : i + 1], epochs[i : i + 1], 3, cfg
        )
        for i in range(4)
    ]
    np.testing.assert_array_equal(whole, np.concatenate([p["image/cam"] for p in parts]))
    assert not np.array_equal(whole, imgs["image/cam"])
    other_epoch = augment_images(imgs, ids, epochs + 1, 3, cfg)["image/cam"]
    other_seed = augment_images(imgs, ids, epochs, 4, cfg)["image/cam"]
    assert not np.array_equal(whole, other_epoch) and not np.array_equal(whole, other_seed)


def test_augmentation_off_is_identity():
    imgs = _images()
    out = augment_images(imgs, np.arange(4), np.zeros(4), 0, AugmentConfig())
    assert out["image/cam"] is imgs["image/cam"]


def test_resize():
    imgs = _images()
    out = resize_images(imgs, (8, 12))["image/cam"]
    assert out.shape == (4, 3, 8, 12) and out.dtype == np.uint8
    flat = {"image/cam": np.full((2, 3, 16, 16), 77, np.uint8)}
    np.testing.assert_array_equal(
        resize_images(flat, (8, 8))["image/cam"], np.full((2, 3, 8, 8), 77)
    )


def test_the_uint8_resize_is_the_float_resize_rounded_and_reads_strided_frames():
    import torch
    import torch.nn.functional as F

    nhwc = np.random.default_rng(0).integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)
    nchw = nhwc.transpose(0, 3, 1, 2)  # how a decoded frame arrives: a strided view
    got = resize_images({"cam": nchw}, (24, 20))["cam"]
    assert got.flags.c_contiguous and got.shape == (3, 3, 24, 20)
    np.testing.assert_array_equal(got, resize_images({"cam": nchw.copy()}, (24, 20))["cam"])
    ref = F.interpolate(torch.from_numpy(nchw.copy()).float(), size=(24, 20), mode="bilinear",
                        antialias=True, align_corners=False)  # fmt: skip
    assert np.abs(got.astype(np.int16) - ref.numpy()).max() <= 1.0


def test_numpy_and_torch_normalisation_agree_bit_for_bit():
    # Read tasks normalise numpy columns; the same map on torch tensors gave the same bits.
    norm = Normalizer.from_stats(STATS, "mean_std")
    x = np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32) * 7
    got = norm.normalize("observation.state", x)
    want = norm.normalize("observation.state", torch.from_numpy(x)).numpy()
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))
    back = norm.unnormalize("observation.state", torch.from_numpy(got)).numpy()
    np.testing.assert_array_equal(norm.unnormalize("observation.state", got), back)


def test_read_transform_resizes_then_augments_tokenizes_and_normalises():
    stats = {"observation.state": STATS["observation.state"]}
    stats["action"] = {"mean": [0.0, 0.0], "std": [1.0, 1.0]}
    config = FlowVLAConfig.from_size("tiny", camera_keys=("cam",), image_size=(8, 8))
    processor = FlowVLAProcessor(config, Normalizer.from_stats(stats, "mean_std"))
    tasks = np.array(["reach the red disc", "go", "go", "reach the red disc"], dtype=object)
    cols = {"sample_id": np.arange(4), "task_index": np.array([0, 1, 1, 0]), "task": tasks}
    cols |= _images()
    cols |= {"state": np.ones((4, 2), np.float32), "actions": np.zeros((4, 8, 2), np.float32)}
    cols["action_is_pad"] = np.zeros((4, 8), bool)
    plain = ReadTransform(processor)(cols, np.zeros(4, np.int64))
    augmented = ReadTransform(processor, AugmentConfig(brightness=0.1), seed=1)(
        cols, np.zeros(4, np.int64)
    )
    assert plain["image/cam"].shape == (4, 3, 8, 8) and plain["image/cam"].dtype == np.uint8
    resized = resize_images({"cam": cols["image/cam"]}, (8, 8))["cam"]
    np.testing.assert_array_equal(plain["image/cam"], resized)
    ids, epochs = cols["sample_id"], np.zeros(4, np.int64)
    keyed = augment_images({"cam": resized}, ids, epochs, 1, AugmentConfig(brightness=0.1))
    np.testing.assert_array_equal(augmented["image/cam"], keyed["cam"])  # after the resize
    tokens, mask = tokenize(["reach the red disc", "go", "go", "reach the red disc"], 48)
    np.testing.assert_array_equal(plain["text_tokens"], tokens.numpy())
    np.testing.assert_array_equal(plain["text_mask"], mask.numpy())
    assert plain["text_mask"].sum(1).tolist() == [18, 2, 2, 18]
    np.testing.assert_allclose(plain["state"], np.tile([0.0, -2.0], (4, 1)))
    assert "task_index" not in plain and plain["sample_id"] is cols["sample_id"]
    batch = processor.collate(plain, "cpu")
    assert (
        batch["images"]["cam"].dtype == torch.float32 and float(batch["images"]["cam"].max()) <= 1
    )
    assert batch["text_tokens"].dtype == torch.int64 and batch["sample_ids"].tolist() == [
        0,
        1,
        2,
        3,
    ]
