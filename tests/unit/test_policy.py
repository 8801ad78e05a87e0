"""An exported policy loads without Ray, checks observations and resizes camera images."""

import numpy as np
import pytest
import torch

from raytrain_vla import policy
from raytrain_vla.data.transforms import Normalizer
from raytrain_vla.export import write_policy
from raytrain_vla.models.registry import build_model

STATS = {
    "observation.state": {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
    "action": {"mean": [0.0, 0.0], "std": [0.03, 0.03]},
}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    kwargs = {
        "size": "tiny",
        "camera_keys": ["observation.image"],
        "image_size": [16, 16],
        "state_dim": 2,
        "action_dim": 2,
        "chunk_size": 8,
        "max_text_len": 48,
        "num_inference_steps": 4,
    }
    torch.manual_seed(0)
    model = build_model("flow_vla", kwargs)
    out = tmp_path_factory.mktemp("policy") / "export"
    write_policy(
        out,
        model.state_dict(),
        "flow_vla",
        kwargs,
        Normalizer.from_stats(STATS, "mean_std"),
        np.zeros(2),
        ["reach the red disc"],
    )
    return out


def test_predicts_in_original_units_from_any_image_layout(policy_dir):
    p = policy.load(policy_dir, seed=3)
    hwc = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    obs = {"state": [0.4, 0.6], "instruction": "reach the red disc"}
    a = p.predict_action({"observation.image": hwc, **obs})
    assert a.shape == (8, 2) and np.isfinite(a).all()
    again = policy.load(policy_dir, seed=3).predict_action(
        {"observation.image": hwc.transpose(2, 0, 1) / 255.0, **obs}
    )
    np.testing.assert_allclose(again, a, atol=1e-5)


@pytest.mark.parametrize(
    "obs, match",
    [
        ({"state": [0.0, 0.0], "instruction": "x"}, "missing"),
        (
            {
                "observation.image": np.zeros((16, 16, 3), np.uint8),
                "state": [0.0],
                "instruction": "x",
            },
            "state",
        ),
        (
            {
                "observation.image": np.zeros((16, 16), np.uint8),
                "state": [0.0, 0.0],
                "instruction": "x",
            },
            "observation.image",
        ),
    ],
)
def test_bad_observations_name_the_problem(policy_dir, obs, match):
    with pytest.raises(ValueError, match=match):
        policy.load(policy_dir).predict_action(obs)


def test_not_a_policy_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        policy.load(tmp_path)
