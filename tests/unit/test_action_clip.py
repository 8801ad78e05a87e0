"""`data.action_clip`: targets are the clipped actions, and every statistic derived from the
data (normalisation, the mean-action baseline, the stats an export carries) is that of the
clipped actions, not of the stored ones."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from _paths import fixtures_root

from raytrain_vla.common.normalize import ACTION, Normalizer
from raytrain_vla.config.errors import ConfigError
from raytrain_vla.config.loader import parse_cli
from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.processor import FlowVLAProcessor
from raytrain_vla.train.inputs import ReadTransform

LOW, HIGH = 200.0, 350.0  # inside the fixture's action range (about 178..398), so clipping bites


def stored_actions(root) -> np.ndarray:
    files = sorted((root / "data").glob("*/*.parquet"))
    columns = [pq.read_table(f, columns=[ACTION]).column(ACTION) for f in files]
    return np.concatenate([np.stack(c.to_numpy(zero_copy_only=False)) for c in columns])


def test_view_statistics_are_those_of_the_clipped_actions():
    root = fixtures_root() / "lerobot_v3" / "pusht_like"
    clipped = np.clip(stored_actions(root).astype(np.float64), LOW, HIGH)
    assert (clipped != stored_actions(root)).any()  # the test means something
    plain = DatasetView.open(DataConfig(root=str(root)), 0, 4)
    view = DatasetView.open(DataConfig(root=str(root), action_clip=[LOW, HIGH]), 0, 4)
    np.testing.assert_allclose(view.mean_action, clipped.mean(0), rtol=1e-6)
    assert not np.allclose(plain.mean_action, clipped.mean(0), rtol=1e-3)
    np.testing.assert_allclose(view.normalizer.shift[ACTION], clipped.mean(0), rtol=1e-6)
    np.testing.assert_allclose(view.normalizer.scale[ACTION], clipped.std(0), rtol=1e-5)
    kept = view.normalizer.stats[ACTION]  # what a LeRobot-format export writes
    np.testing.assert_allclose(kept["max"], clipped.max(0), rtol=1e-6)
    np.testing.assert_allclose(kept["q99"], np.quantile(clipped, 0.99, axis=0), rtol=1e-5)
    assert plain.normalizer.stats[ACTION]["max"].max() > HIGH  # the stored stats are untouched


def test_read_transform_clips_targets_before_normalising():
    stats = {
        "observation.state": {"mean": [0.0, 0.0], "std": [1.0, 1.0]},
        ACTION: {"mean": [0.5, -0.5], "std": [2.0, 2.0]},
    }
    normalizer = Normalizer.from_stats(stats, "mean_std")
    config = FlowVLAConfig.from_size("tiny", camera_keys=("cam",), image_size=(8, 8))
    processor = FlowVLAProcessor(config, normalizer)
    rng = np.random.default_rng(0)
    actions = rng.normal(0, 5, (3, 8, 2)).astype(np.float32)
    cols = {
        "sample_id": np.arange(3), "task": np.array(["go"] * 3, dtype=object),
        "image/cam": np.zeros((3, 3, 8, 8), np.uint8), "state": np.zeros((3, 2), np.float32),
        "actions": actions, "action_is_pad": np.zeros((3, 8), bool),
    }  # fmt: skip
    epochs = np.zeros(3, np.int64)
    clipped = ReadTransform(processor, action_clip=(-1.0, 1.0))(cols, epochs)["actions"]
    plain = ReadTransform(processor)(cols, epochs)["actions"]
    want = normalizer.normalize(ACTION, np.clip(actions, -1.0, 1.0))
    np.testing.assert_array_equal(clipped, want)
    assert not np.allclose(plain, want)
    np.testing.assert_array_equal(cols["actions"], actions)  # the read's columns are not mutated


@pytest.mark.parametrize("bad", [[1.0], [1.0, -1.0], [0.0, float("nan")]])
def test_bad_clip_names_the_key(bad):
    with pytest.raises(ConfigError, match="'data.action_clip'"):
        parse_cli([f"--data.action_clip={bad}".replace("nan", ".nan")])
