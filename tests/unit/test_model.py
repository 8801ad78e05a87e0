"""flow_vla unit tests: shapes, gradients, masking, parameter groups, determinism, sizes."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA, count_parameters
from raytrain_vla.models.flow_vla.options import FlowVLAOptions
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.models.registry import FAMILIES, get_family
from raytrain_vla.train.noise import flow_noise_and_time

CAMS = ["observation.images.top", "observation.images.wrist"]
B, CHUNK, A, S = 4, 8, 3, 5


def make_model(seed: int = 0) -> FlowVLA:
    torch.manual_seed(seed)
    config = FlowVLAConfig.from_size(
        "tiny", camera_keys=tuple(CAMS), image_size=(32, 24), state_dim=S, action_dim=A,
        chunk_size=CHUNK, max_text_len=24, num_inference_steps=4,
    )  # fmt: skip
    return get_family("flow_vla").build(config)


def make_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens, mask = tokenize(["reach the red disc", "go to the blue one", "", "move"], 24)
    pad = torch.zeros(B, CHUNK, dtype=torch.bool)
    pad[0, 5:] = True
    pad[2, 1:] = True
    return {
        "images": {k: torch.rand(B, 3, 32, 24, generator=g) for k in CAMS},
        "state": torch.randn(B, S, generator=g),
        "text_tokens": tokens,
        "text_mask": mask,
        "actions": torch.randn(B, CHUNK, A, generator=g),
        "action_is_pad": pad,
    }


def noise_time(step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return flow_noise_and_time(0, step, list(range(B)), (CHUNK, A))


def test_tokenizer_bytes_padding_truncation():
    tokens, mask = tokenize(["ab", "é", "abcdef"], 4)
    assert tokens.dtype == torch.long and mask.dtype == torch.bool
    assert tokens[0].tolist() == [ord("a") + 1, ord("b") + 1, 0, 0]
    assert tokens[1, :2].tolist() == [b + 1 for b in "é".encode()]
    assert mask.sum(1).tolist() == [2, 2, 4]
    assert int(tokens.max()) < 257


def test_loss_shape_finite_positive():
    loss = make_model().compute_loss(make_batch(), *noise_time())
    assert loss.shape == (B,)
    assert torch.isfinite(loss).all() and (loss > 0).all()


def test_every_parameter_gets_a_finite_gradient():
    model = make_model()
    model.compute_loss(make_batch(), *noise_time()).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    # The zero-initialised FiLM output layers must still learn (nonzero gradient).
    film_last = [p for n, p in model.named_parameters() if re.search(r"films\.\d+\.mlp\.fc2", n)]
    assert film_last and all(p.grad.abs().sum() > 0 for p in film_last)


def test_training_uses_the_velocity_inference_integrates_and_pads_are_not_targets():
    # sample_actions calls the action expert with no knowledge of the episode end; the loss must
    # train that same function (a training-only pad mask made near-end chunks 9x worse), and
    # average the error over valid positions only.
    model, batch = make_model(), make_batch()
    noise, time = noise_time()
    loss = model.compute_loss(batch, noise, time)
    t = time[:, None, None]
    x_t = t * noise + (1 - t) * batch["actions"]
    velocity = model.action_expert(x_t, time, *model.embed_prefix(batch))
    err = (velocity - (noise - batch["actions"])).square().mean(-1)
    valid = ~batch["action_is_pad"]
    torch.testing.assert_close(loss, (err * valid).sum(1) / valid.sum(1))


def test_text_padding_is_masked_out():
    # embed_prefix drops all-padding text columns; the full padded prefix must agree with it.
    model, batch = make_model(), make_batch()
    trimmed, trimmed_mask = model.embed_prefix(batch)
    tokens, mask = batch["text_tokens"], batch["text_mask"]
    text_emb = model.backbone.text_embed(tokens)
    image_tokens = model.vision(batch["images"], text_emb, mask)
    full, full_mask = model.backbone(image_tokens, text_emb, mask, batch["state"])
    keep = trimmed.shape[1] - 1  # image + kept text columns; the state token comes last
    assert full.shape[1] > trimmed.shape[1]
    valid = trimmed_mask[:, :keep]
    torch.testing.assert_close(full[:, :keep][valid], trimmed[:, :keep][valid])
    torch.testing.assert_close(full[:, -1], trimmed[:, -1])
    assert torch.equal(full_mask[:, :keep], trimmed_mask[:, :keep])


def test_roles_partition_parameters_by_tower():
    model = make_model()
    by_role: dict[str, int] = {}
    for name, p in model.named_parameters():
        role = model.role_of(name)  # raises for a parameter without a role
        by_role[role] = by_role.get(role, 0) + p.numel()
    assert (
        set(by_role) == set(get_family("flow_vla").roles) == {"vision", "backbone", "action_expert"}
    )
    assert [n for n, _ in model.named_children()] == list(by_role)
    counts = count_parameters(model)
    assert all(counts[role] == n for role, n in by_role.items())


def test_fsdp_units_are_every_transformer_block_then_the_vision_tower():
    model = make_model()
    blocks = model.activation_checkpoint_units()
    assert len(blocks) == model.config.backbone_layers + model.config.expert_layers
    assert all(any(b is m for m in model.modules()) for b in blocks)
    assert model.fsdp_units() == [*blocks, model.vision]
    assert model.noise_shape == (CHUNK, A)


def test_tiny_is_under_one_million_params():
    assert count_parameters(make_model())["total"] < 1_000_000


def test_flow_noise_and_time_keyed_to_sample_not_batch():
    noise, time = flow_noise_and_time(7, 3, [10, 11, 12, 13], (CHUNK, A))
    assert noise.shape == (4, CHUNK, A) and time.shape == (4,)
    assert noise.dtype == torch.float32 and time.dtype == torch.float32
    assert ((time >= 0.001) & (time <= 1.0)).all()
    again, time_again = flow_noise_and_time(7, 3, [10, 11, 12, 13], (CHUNK, A))
    assert torch.equal(noise, again) and torch.equal(time, time_again)
    # Another rank processing a different slice, in another order, draws the same per-sample values.
    other, other_time = flow_noise_and_time(7, 3, [13, 99, 11], (CHUNK, A))
    assert torch.equal(other[0], noise[3]) and torch.equal(other[2], noise[1])
    assert other_time[0] == time[3] and other_time[2] == time[1]
    # A different step or seed gives different noise.
    assert not torch.equal(flow_noise_and_time(7, 4, [10], (CHUNK, A))[0][0], noise[0])
    assert not torch.equal(flow_noise_and_time(8, 3, [10], (CHUNK, A))[0][0], noise[0])


def test_sample_actions_shape_and_determinism():
    model, batch = make_model(), make_batch()
    obs = {k: v for k, v in batch.items() if k not in ("actions", "action_is_pad")}
    noise, _ = noise_time()
    out = model.sample_actions(obs, noise)
    assert out.shape == (B, CHUNK, A) and torch.isfinite(out).all()
    torch.testing.assert_close(out, model.sample_actions(obs, noise), rtol=0, atol=0)
    assert not torch.equal(out, model.sample_actions(obs, noise, num_steps=2))


def test_language_changes_the_prediction():
    model, batch = make_model(), make_batch()
    # Make FiLM non-trivial so the instruction reaches the vision tower too.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "films" in n:
                p.normal_(0, 0.1)
    obs = {k: v for k, v in batch.items() if k not in ("actions", "action_is_pad")}
    noise, _ = noise_time()
    first = model.sample_actions(obs, noise)
    obs["text_tokens"], obs["text_mask"] = tokenize(["reach the blue disc"] * B, 24)
    assert not torch.allclose(first, model.sample_actions(obs, noise))


def test_config_round_trip_and_errors():
    cfg = FlowVLAConfig.from_size("tiny", camera_keys=CAMS, image_size=(32, 24), action_dim=A)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 8  # type: ignore[misc]
    d = cfg.to_dict()
    assert d["image_size"] == [32, 24]
    assert FlowVLAConfig.from_dict(d) == cfg
    with pytest.raises(ValueError, match="unknown FlowVLAConfig keys"):
        FlowVLAConfig.from_dict({**d, "dmodel": 3})
    with pytest.raises(ValueError, match="huge"):
        FlowVLAConfig.from_size("huge")


def test_vision_strides_keep_256_px_at_the_tokens_128_px_get():
    """`model.flow_vla.vision_strides` adds stem convs (the preset's last width) so a larger
    frame reaches the transformer as the same token grid; the preset is untouched without it."""
    family = get_family("flow_vla")
    spec = DataSpec(
        camera_shapes={CAMS[0]: (3, 256, 256)}, state_dim=S, action_dim=A, chunk_size=CHUNK
    )
    plain = FlowVLAConfig.resolve(FlowVLAOptions(), spec)
    finer = FlowVLAConfig.resolve(FlowVLAOptions(vision_strides=(2, 2, 2, 2)), spec)
    assert (plain.vision_strides, plain.vision_channels) == ((2, 2, 2), (32, 32, 32))
    assert (finer.vision_strides, finer.vision_channels) == ((2, 2, 2, 2), (32, 32, 32, 32))
    assert family.input_budget(plain).tokens_per_camera == 32 * 32
    assert family.input_budget(finer).tokens_per_camera == 16 * 16
    assert FlowVLAConfig.from_dict(finer.to_dict()) == finer  # what an export rebuilds from
    model = family.build(dataclasses.replace(finer, max_text_len=24))
    tokens, mask = tokenize(["reach"] * 2, 24)
    obs = {"images": {CAMS[0]: torch.rand(2, 3, 256, 256)}, "state": torch.randn(2, S),
           "text_tokens": tokens, "text_mask": mask}  # fmt: skip
    noise = torch.randn(2, CHUNK, A)
    assert model.sample_actions(obs, noise).shape == (2, CHUNK, A)


def test_registry_unknown_type_lists_known():
    assert "flow_vla" in FAMILIES
    with pytest.raises(ValueError, match="flow_vla"):
        get_family("no_such_model")


def test_meta_init_then_materialise():
    with torch.device("meta"):
        model = make_model()
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    loss = model.compute_loss(make_batch(), *noise_time())
    assert torch.isfinite(loss).all()


def test_base_on_meta_is_about_one_billion():
    config = FlowVLAConfig.from_size(
        "base", camera_keys=tuple(CAMS), image_size=(224, 224), state_dim=14, action_dim=14,
        chunk_size=50,
    )  # fmt: skip
    with torch.device("meta"):
        model = FlowVLA(config)
    total = count_parameters(model)["total"]
    assert 0.8e9 < total < 1.3e9
    assert all(p.is_meta for p in model.parameters())


def test_text_longer_than_max_text_len_is_a_clear_error():
    model, batch = make_model(), make_batch()
    batch["text_tokens"], batch["text_mask"] = tokenize(["x" * 30] * B, 30)
    with pytest.raises(ValueError, match="max_text_len"):
        model.compute_loss(batch, *noise_time())


def test_keypoints_say_where_a_feature_is_finer_than_a_cell():
    """SpatialSoftmax's (x, y) is a feature's softmax-weighted cell centre: one hot cell gives
    that cell's centre, two equal neighbours the point between them (the sub-cell precision a
    2-3 px marker needs), x across the width and y down the height."""
    from raytrain_vla.models.flow_vla.layers import SpatialSoftmax

    points = SpatialSoftmax(channels=1, keypoints=1)
    with torch.no_grad():
        points.conv.weight.fill_(1.0)
        points.conv.bias.zero_()
        points.log_temperature.fill_(5.0)  # sharp: a hot cell takes all the weight
    features = torch.zeros(2, 1, 4, 8)  # h=4, w=8: cell centres x = -7/8..7/8, y = -3/4..3/4
    features[0, 0, 1, 6] = 10.0
    features[1, 0, 3, 2:4] = 10.0
    xy = points(features)
    assert xy.shape == (2, 1, 2)
    torch.testing.assert_close(xy[0, 0], torch.tensor([5 / 8, -1 / 4]), atol=1e-4, rtol=0)
    torch.testing.assert_close(xy[1, 0], torch.tensor([-1 / 4, 3 / 4]), atol=1e-4, rtol=0)


def test_keypoint_tokens_follow_each_cameras_grid_and_learn():
    """`keypoints=K` adds K tokens per camera after its grid (the per-camera blocks an image
    mask relies on), every new weight gets a gradient, and an export's config rebuilds it;
    `keypoints=0` (the default) builds exactly the parameters it always had."""
    family = get_family("flow_vla")
    spec = DataSpec(
        camera_shapes={k: (3, 32, 24) for k in CAMS}, state_dim=S, action_dim=A, chunk_size=CHUNK
    )
    plain = FlowVLAConfig.resolve(FlowVLAOptions(), spec)
    pointed = FlowVLAConfig.resolve(FlowVLAOptions(keypoints=8), spec)
    assert FlowVLAConfig.from_dict(pointed.to_dict()) == pointed
    assert family.input_budget(pointed).tokens_per_camera == 4 * 3 + 8
    assert dataclasses.replace(plain, max_text_len=24, num_inference_steps=4) == make_model().config
    torch.manual_seed(0)
    model = family.build(dataclasses.replace(pointed, max_text_len=24))
    assert not any("keypoint" in name for name, _ in make_model().named_parameters())
    batch = make_batch()
    text_emb = model.backbone.text_embed(batch["text_tokens"])
    tokens = model.vision(batch["images"], text_emb, batch["text_mask"])
    assert tokens.shape == (B, 2 * (4 * 3 + 8), 64)
    noise, time = noise_time()
    model(batch, noise, time).mean().backward()
    new = {n: p for n, p in model.named_parameters() if "keypoint" in n}
    assert len(new) == 2 * 3 + 3  # per camera: conv weight, bias, temperature; proj w, b; pos
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new.values())


def test_vision_channels_widen_the_stem():
    """`model.flow_vla.vision_channels` sets each stem conv's width, with or without strides."""
    spec = DataSpec(
        camera_shapes={CAMS[0]: (3, 128, 128)}, state_dim=S, action_dim=A, chunk_size=CHUNK
    )
    wide = FlowVLAConfig.resolve(FlowVLAOptions(vision_channels=(64, 64, 48)), spec)
    assert (wide.vision_strides, wide.vision_channels) == ((2, 2, 2), (64, 64, 48))
    four = FlowVLAOptions(vision_strides=(2, 2, 2, 2), vision_channels=(16, 32, 64, 64))
    finer = FlowVLAConfig.resolve(four, spec)
    assert (finer.vision_strides, finer.vision_channels) == ((2, 2, 2, 2), (16, 32, 64, 64))
    model = get_family("flow_vla").build(dataclasses.replace(wide, max_text_len=24))
    assert [conv.out_channels for conv in model.vision.stems[0].convs] == [64, 64, 48]


def test_width_widens_both_transformers_at_the_presets_head_size():
    """`model.flow_vla.width` sets d_model, the expert's and FiLM's width; heads stay 32 wide."""
    spec = DataSpec(
        camera_shapes={CAMS[0]: (3, 64, 64)}, state_dim=S, action_dim=A, chunk_size=CHUNK
    )
    wide = FlowVLAConfig.resolve(FlowVLAOptions(width=128), spec)
    dims = (wide.d_model, wide.num_heads, wide.expert_d_model, wide.expert_heads, wide.film_dim)
    assert dims == (128, 4, 128, 4, 128)
    assert FlowVLAConfig.resolve(FlowVLAOptions(width=0), spec) == FlowVLAConfig.resolve(
        FlowVLAOptions(), spec
    )
    model = get_family("flow_vla").build(dataclasses.replace(wide, max_text_len=24))
    tokens, mask = tokenize(["reach"] * 2, 24)
    obs = {"images": {CAMS[0]: torch.rand(2, 3, 64, 64)}, "state": torch.randn(2, S),
           "text_tokens": tokens, "text_mask": mask}  # fmt: skip
    assert model.sample_actions(obs, torch.randn(2, CHUNK, A)).shape == (2, CHUNK, A)
