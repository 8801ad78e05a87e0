"""Fine-tuning starts from a policy's weights; a changed head needs an explicit allow-list."""

import numpy as np
import pytest
import torch

from raytrain_vla import policy
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.policy.format import PolicyMeta, write_policy
from raytrain_vla.train.init_source import load_pretrained

CONFIG = FlowVLAConfig.from_size("tiny", image_size=(16, 16), num_inference_steps=3)
SPEC = DataSpec({"observation.image": (3, 16, 16)}, state_dim=2, action_dim=2, chunk_size=8)


def build_model(config: FlowVLAConfig = CONFIG) -> FlowVLA:
    return FlowVLA(config)


STATS = {
    "observation.state": {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
    "action": {"mean": [0.0, 0.0], "std": [0.03, 0.03]},
}
HEAD = [r"^action_expert\.action_(in|out)\."]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model()
    out = tmp_path_factory.mktemp("pretrained") / "policy"
    norm = Normalizer.from_stats(STATS, "mean_std")
    write_policy(out, model.state_dict(), PolicyMeta("flow_vla", CONFIG, SPEC), norm)
    return out


def test_init_from_a_policy_reproduces_its_predictions(pretrained):
    torch.manual_seed(1)  # a different fresh init, overwritten by the policy's weights
    model = build_model()
    assert load_pretrained(model, pretrained, []) == []
    reference = policy.load(pretrained, seed=4)
    tuned = policy.Policy(model, reference.processor, reference.meta, seed=4)
    obs = {
        "observation.image": np.full((16, 16, 3), 90, np.uint8),
        "state": np.array([0.3, 0.7], np.float32),
        "instruction": "reach",
    }
    np.testing.assert_array_equal(tuned.predict_action(obs), reference.predict_action(obs))
    # A single .safetensors file works too.
    assert load_pretrained(build_model(), pretrained / "model.safetensors", []) == []


def test_another_action_dimension_needs_the_allow_list(pretrained):
    torch.manual_seed(1)
    model = build_model(FlowVLAConfig.from_size("tiny", image_size=(16, 16), action_dim=3))
    with pytest.raises(ValueError, match="shape differs.*action_expert.action_in.weight"):
        load_pretrained(model, pretrained, [])
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    skipped = load_pretrained(model, pretrained, HEAD)
    assert skipped == [
        "action_expert.action_in.weight",
        "action_expert.action_out.bias",
        "action_expert.action_out.weight",
    ]
    theirs = policy.load(pretrained).model.state_dict()
    for key, value in model.state_dict().items():
        expected = fresh[key] if key in skipped else theirs[key]
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=key)


def test_not_a_policy_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a policy directory"):
        load_pretrained(build_model(), tmp_path, [])
