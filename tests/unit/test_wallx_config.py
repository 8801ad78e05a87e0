"""wall_x's options and files: the base checkpoint found (a directory, a name in the local
Hugging Face cache) or one error naming the key; FAST refused; LeRobot's freezing and LoRA; base
weights loaded as LeRobot loads them. No Ray."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from _paths import fixtures_root

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import LoRAConfig
from raytrain_vla.models.registry import get_family
from raytrain_vla.models.wall_x.options import WallXOptions

SPEC = DataSpec(
    {"observation.images.face_view": (3, 48, 64)}, state_dim=3, action_dim=2, chunk_size=4
)


@pytest.fixture(scope="module")
def base():
    return fixtures_root() / "lerobot_wallx_tiny" / "base"


@pytest.fixture(scope="module")
def family():
    return get_family("wall_x")


def test_fast_mode_is_refused_in_one_line():
    with pytest.raises(ValueError, match="only 'diffusion'"):
        WallXOptions(prediction_mode="fast").check("model.wall_x")


def test_a_missing_base_is_one_error_naming_the_key(family, tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        ValueError, match=r"model\.wall_x\.base_path='org/missing'.*local Hugging Face cache"
    ):
        family.check_options(WallXOptions(base_path="org/missing"))
    with pytest.raises(ValueError, match="no Wall-OSS base checkpoint"):
        family.check_options(WallXOptions(base_path=str(tmp_path / "nowhere")))


def test_a_hub_named_base_resolves_from_the_local_cache(family, base, tmp_path, monkeypatch):
    """huggingface_hub's cache layout: models--org--name/snapshots/<rev>/ and refs/main."""
    repo = tmp_path / "hub" / "models--x-square-robot--wall-oss-flow"
    shutil.copytree(base, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    config = family.resolve_config(WallXOptions(), SPEC)  # the default name
    assert config.base_name == "x-square-robot/wall-oss-flow"
    assert config.base_path == str(repo / "snapshots" / "abc123")


def test_fresh_from_the_base_loads_its_weights_as_lerobot_does(family, base):
    from safetensors.torch import load_file

    config = family.resolve_config(WallXOptions(base_path=str(base)), SPEC)
    assert (config.max_state_dim, config.max_action_dim) == (12, 10)  # the base's dof sums
    model = family.build(config)
    loaded = family.load_base_weights(model, config)
    assert set(loaded) == set(model.state_dict())
    theirs = load_file(str(base / "model.safetensors"))
    assert torch.equal(model.embed_tokens.weight, theirs["model.embed_tokens.weight"].float())
    assert torch.equal(model.action_head.w1.weight, theirs["action_preprocessor.w1.weight"].float())


def test_freezing_follows_lerobot_s_options(family, base):
    options = WallXOptions(base_path=str(base))
    names = {
        flag: family.build(
            family.resolve_config(dataclasses.replace(options, **{flag: True}), SPEC)
        ).frozen_parameters()
        for flag in ("freeze_vision_encoder", "train_action_expert_only")
    }
    last = "layers.2.moe.experts.0."  # the last layer's VLM expert: no output reads it
    assert all(any(n.startswith(last) for n in frozen) for frozen in names.values())
    assert {n for n in names["freeze_vision_encoder"] if not n.startswith(last)} == {
        n for n in names["train_action_expert_only"] if n.startswith("visual.")
    }
    trainable = {
        n
        for n, _ in family.build(family.resolve_config(options, SPEC)).named_parameters()
        if n not in names["train_action_expert_only"]
    }
    assert trainable and all(
        n.startswith("action_head.") or ".moe.experts.1." in n for n in trainable
    )


def test_lora_adapts_the_language_model_and_merges_on_export(family, base):
    options = WallXOptions(base_path=str(base))
    lora = LoRAConfig(r=4, alpha=8.0)
    config = family.resolve_config(options, SPEC, lora=lora)
    model = family.build(config)
    adapters = model.fresh_parameters()
    assert adapters and all(".lora_" in n for n in adapters)
    assert all(n.startswith("layers.") for n in adapters)
    frozen = model.frozen_parameters()
    assert not frozen & adapters
    assert any(n.startswith("visual.") for n, _ in model.named_parameters() if n not in frozen)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.fill_(0.01)
    state, merged_config = family.policy_state(model.state_dict(), config)
    assert merged_config.lora == {} and not any(".lora_" in n for n in state)
    plain = family.build(merged_config)
    plain.load_state_dict(state)  # the merged weights load into the model without adapters
    with pytest.raises(ValueError, match="train_action_expert_only"):
        family.resolve_config(
            dataclasses.replace(options, train_action_expert_only=True), SPEC, lora=lora
        )


def test_a_lerobot_export_refuses_two_cameras_from_one_source(family, base, tmp_path):
    spec = DataSpec({"observation.image": (3, 32, 32)}, state_dim=2, action_dim=2, chunk_size=4)
    options = WallXOptions(
        base_path=str(base),
        cameras={
            "observation.images.face_view": "observation.image",
            "observation.images.left_wrist_view": "observation.image",
        },
    )
    pretrained = fixtures_root() / "lerobot_wallx_tiny" / "pretrained_model"
    config = family.resolve_config(options, spec, init_from=str(pretrained))
    from raytrain_vla.common.normalize import Normalizer

    with pytest.raises(ValueError, match="rename map"):
        family.write_foreign(
            "lerobot", tmp_path / "out", family.build(config).state_dict(), config,
            Normalizer({}, {}, {}),
        )  # fmt: skip
    assert not (tmp_path / "out").exists()
