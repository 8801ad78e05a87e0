"""pi0 and pi0.5 against LeRobot 0.6.1's own numbers (../shared/fixtures/lerobot_pi0_tiny and
lerobot_pi05_tiny).

Every array group of each fixture (raw -> pre -> model_in -> inter -> sample -> train ->
policy_forward -> grad -> pipeline) is compared at atol = rtol = 1e-4 (integers and masks
exactly), the checkpoint is read key for key and written back byte-equal in tensors and JSON,
and each of the README's typical mistakes is shown to move the sampled actions past that.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from _paths import fixtures_root
from safetensors.torch import load_file

from raytrain_vla import policy
from raytrain_vla.models.registry import get_family

VARIANTS = ("pi0", "pi05")


class Fixture:
    def __init__(self, variant: str):
        self.variant = variant
        self.folder = fixtures_root() / f"lerobot_{variant}_tiny"
        self.pretrained = self.folder / "pretrained_model"
        self.ref = dict(np.load(self.folder / "reference.npz"))
        self.info = json.loads((self.folder / "reference.json").read_text())
        self.spec = json.loads((self.folder / "spec.json").read_text())
        self.cameras = list(self.spec["cameras"])
        self.policy = policy.load(self.pretrained, options={"vision_heads": 2})

    def columns(self, with_actions: bool = True) -> dict[str, np.ndarray]:
        cols = {f"image/{cam}": self.ref[f"raw.{cam}"] for cam in self.cameras}
        cols["state"] = self.ref["raw.observation.state"]
        cols["task"] = np.array(self.info["tasks"], dtype=object)
        if with_actions:
            cols["actions"] = self.ref["raw.action"]
            cols["action_is_pad"] = self.ref["raw.action_is_pad"]
        return cols

    def batch(self, with_actions: bool = True) -> tuple[dict, dict]:
        encoded = self.policy.processor.encode(self.columns(with_actions))
        return encoded, self.policy.processor.collate(encoded, "cpu")


@pytest.fixture(scope="module", params=VARIANTS)
def fx(request) -> Fixture:
    return Fixture(request.param)


def close(got, expected: np.ndarray, name: str) -> None:
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} vs {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected, err_msg=name)
    else:
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4, err_msg=name)


def test_weights_load_key_for_key_with_lerobot_s_shapes(fx):
    """Every tensor of LeRobot's state dict (both LM heads included, untied) is read into the
    parameter of the same LeRobot name, equal to the file."""
    from raytrain_vla.models.pi_gemma.lerobot_io import key_map

    theirs = load_file(str(fx.pretrained / "model.safetensors"))
    listed = {e["key"]: e["shape"] for e in fx.info["state_dict"]}
    assert {k: list(v.shape) for k, v in theirs.items()} == listed
    mapping = key_map(fx.policy.model)
    assert sorted(mapping.values()) == sorted(listed)
    own = fx.policy.model.state_dict()
    for ours, key in mapping.items():
        assert torch.equal(own[ours], theirs[key]), key


def test_preprocessing_matches(fx):
    ref = fx.ref
    encoded, batch = fx.batch()
    close(encoded["lang_tokens"], ref["pre.observation.language.tokens"], "tokens")
    close(encoded["lang_masks"], ref["pre.observation.language.attention_mask"], "token mask")
    state_dim = ref["raw.observation.state"].shape[1]
    close(encoded["state"][:, :state_dim], ref["pre.observation.state"], "normalised state")
    close(encoded["actions"], ref["pre.action"], "normalised actions")
    for cam in fx.cameras:
        close(batch["images"][cam], ref[f"model_in.{cam}"], f"image {cam}")
        close(batch["image_masks"][cam], ref[f"model_in.{cam}_mask"], f"mask {cam}")
    close(batch["actions"], ref["model_in.action"], "padded actions")
    if fx.variant == "pi0":
        close(batch["state"], ref["model_in.state"], "padded state")
    else:
        from raytrain_vla.models.pi_gemma.processor import state_bins

        close(state_bins(encoded["state"][:, :state_dim]), ref["pre.state_bins"], "state bins")
        prompts = fx.policy.processor.prompts(fx.columns()["task"], encoded["state"][:, :state_dim])
        assert prompts == fx.info["tasks_after_preprocessor"]


def test_prefix_and_suffix_match(fx):
    ref, model = fx.ref, fx.policy.model
    _, batch = fx.batch()
    time = torch.from_numpy(ref["train.time"])
    with torch.no_grad():
        for cam in fx.cameras:
            close(model.embed_image(batch["images"][cam]), ref[f"inter.img_emb.{cam}"], cam)
        close(model.embed_language(batch["lang_tokens"]), ref["inter.lang_emb"], "lang_emb")
        prefix, pads, marks = model.embed_prefix(batch)
        close(prefix, ref["inter.prefix_embs"], "prefix_embs")
        close(pads, ref["inter.prefix_pad_masks"], "prefix pads")
        close(marks, ref["inter.prefix_att_masks"], "prefix marks")
        x_t = torch.from_numpy(ref["train.x_t"])
        suffix, suffix_marks, cond = model.embed_suffix(batch["state"], x_t, time)
        close(suffix, ref["inter.suffix_embs"], "suffix_embs")
        close(suffix_marks.to(torch.from_numpy(ref["inter.suffix_att_masks"]).dtype),
              ref["inter.suffix_att_masks"], "suffix marks")  # fmt: skip
        if fx.variant == "pi05":
            close(cond, ref["inter.adarms_cond"], "adarms_cond")
        pads = torch.cat([pads, torch.ones_like(suffix_marks)], dim=1)
        close(torch.cumsum(pads, dim=1) - 1, ref["inter.position_ids"], "positions")


def test_sampling_matches_every_euler_step(fx):
    _, batch = fx.batch(with_actions=False)
    trace: list = []
    actions = fx.policy.model.sample_actions(batch, torch.from_numpy(fx.ref["sample.noise"]), trace)
    close(torch.stack(trace), fx.ref["sample.v_t"], "v_t per step")
    close(actions, fx.ref["sample.actions"], "sample.actions")


def test_training_loss_and_gradients_match(fx):
    ref, model = fx.ref, fx.policy.model
    _, batch = fx.batch()
    noise, time = torch.from_numpy(ref["train.noise"]), torch.from_numpy(ref["train.time"])
    with torch.no_grad():
        losses = model.flow_losses(batch, noise, time)
    close(losses, ref["train.losses"], "train.losses")
    close(losses.mean(), ref["train.loss_mean"], "train.loss_mean")
    model.train()
    model.zero_grad()
    per_sample = model(batch, noise, time)
    close(per_sample.detach(), ref["policy_forward.per_sample_loss"], "per-sample loss")
    per_sample.mean().backward()
    close(per_sample.mean().detach(), ref["policy_forward.loss"], "policy_forward.loss")
    from raytrain_vla.models.pi_gemma.lerobot_io import key_map

    names = {key: ours for ours, key in key_map(model).items()}
    params = dict(model.named_parameters())
    norms = [
        0.0 if params[names[k]].grad is None else float(params[names[k]].grad.norm())
        for k in fx.info["grad_norm_keys"]
    ]
    close(np.array(norms, np.float32), ref["grad.norms"], "grad norms")
    model.zero_grad()
    model.eval()
    # What gets no gradient in LeRobot is what the model keeps frozen.
    frozen = {
        names[k]
        for k, n in zip(fx.info["grad_norm_keys"], ref["grad.norms"], strict=True)
        if n == 0
    }
    assert frozen == model.frozen_parameters()


def test_pipeline_matches_with_lerobot_batches_and_select_action_queues_the_chunk(fx):
    ref = fx.ref
    batch = {cam: torch.from_numpy(ref[f"raw.{cam}"]) for cam in fx.cameras}
    batch["observation.state"] = torch.from_numpy(ref["raw.observation.state"])
    batch["task"] = fx.info["tasks"]
    out = fx.policy.predict_action_chunk(batch, noise=torch.from_numpy(ref["sample.noise"]))
    close(out, ref["pipeline.action_chunk"], "pipeline.action_chunk")
    normalized = fx.policy.processor.normalizer.normalize("action", out)
    close(normalized, ref["pipeline.action_chunk_normalized"], "normalized chunk")
    seeded = fx.policy.predict_action_chunk(
        batch, noise=torch.from_numpy(ref["pipeline_seeded.noise"])
    )
    close(seeded[:, 0], ref["pipeline_seeded.select_action"], "select_action")
    queue = fx.policy.processor.normalizer.normalize("action", seeded)
    close(queue, ref["pipeline_seeded.select_action_queue_normalized"], "action queue")
    assert fx.policy.n_action_steps == fx.spec["n_action_steps"]


@pytest.mark.parametrize(
    "mistake", ["top_left_padding", "no_sqrt_scaling", "cos_sin_time", "positions_over_padding"]
)
def test_each_known_mistake_breaks_the_match(fx, monkeypatch, mistake):
    """The comparisons above would catch each mistake the fixtures' READMEs list."""
    from raytrain_vla.models.pi_gemma import model, processor

    if mistake == "top_left_padding":

        def top_left(img, height, width):
            h, w = img.shape[2:]
            ratio = max(w / width, h / height)
            new_h, new_w = int(h / ratio), int(w / ratio)
            img = torch.nn.functional.interpolate(img, size=(new_h, new_w), mode="bilinear")
            return torch.nn.functional.pad(img, (width - new_w, 0, height - new_h, 0))

        monkeypatch.setattr(processor, "resize_with_centred_pad", top_left)
    elif mistake == "no_sqrt_scaling":
        monkeypatch.setattr(model, "math", type("M", (), {"sqrt": staticmethod(lambda x: 1.0)}))
    elif mistake == "cos_sin_time":
        original = model.time_embedding

        def cos_sin(time, dim, lo, hi):
            emb = original(time, dim, lo, hi)
            return torch.cat([emb[:, dim // 2 :], emb[:, : dim // 2]], dim=-1)

        monkeypatch.setattr(model, "time_embedding", cos_sin)
    elif mistake == "positions_over_padding":
        cumsum = torch.cumsum
        monkeypatch.setattr(model.torch, "cumsum", lambda x, dim: cumsum(torch.ones_like(x), dim))
    _, batch = fx.batch(with_actions=False)
    actions = fx.policy.model.sample_actions(batch, torch.from_numpy(fx.ref["sample.noise"]))
    error = float((actions - torch.from_numpy(fx.ref["sample.actions"])).abs().max())
    assert error > 1e-2, f"{mistake} moved the actions by only {error}"
    assert math.isfinite(error)


def test_lerobot_export_round_trip_is_exact(fx, tmp_path):
    family = get_family(fx.variant)
    out = family.write_foreign(
        "lerobot", tmp_path / "pretrained_model", fx.policy.model.state_dict(),
        fx.policy.model.config, fx.policy.processor.normalizer,
    )  # fmt: skip
    for original in sorted(fx.pretrained.iterdir()):
        written = out / original.name
        if original.suffix == ".safetensors":
            a, b = load_file(str(original)), load_file(str(written))
            assert sorted(a) == sorted(b), original.name
            for key in a:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert json.loads(original.read_text()) == json.loads(written.read_text()), original
    extra = {p.name for p in out.iterdir()} - {p.name for p in fx.pretrained.iterdir()}
    assert extra == {"tokenizer"} and (out / "tokenizer" / "tokenizer.json").is_file()
    again = policy.load(out, options={"vision_heads": 2})  # finds tokenizer/ inside
    _, batch = fx.batch(with_actions=False)
    noise = torch.from_numpy(fx.ref["sample.noise"])
    assert torch.equal(
        again.model.sample_actions(batch, noise), fx.policy.model.sample_actions(batch, noise)
    )
