"""SmolVLA against LeRobot 0.6.1's own numbers (../shared/fixtures/lerobot_smolvla_tiny).

Every array group of the fixture (raw -> pre -> model_in -> inter -> sample -> train ->
policy_forward -> pipeline) is compared at atol = rtol = 1e-4 (integers and masks exactly), and
each of the README's typical mistakes is shown to move the sampled actions far past that.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from _paths import fixtures_root
from safetensors.torch import load_file

from raytrain_vla import policy
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.registry import get_family
from raytrain_vla.models.smolvla.options import SmolVLAOptions

FIXTURE = fixtures_root() / "lerobot_smolvla_tiny"
PRETRAINED = FIXTURE / "pretrained_model"
CAMERAS = ["observation.images.front", "observation.images.wrist"]
TASKS = ["pick up the red cube", "open the drawer"]


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURE / "reference.npz"))


@pytest.fixture(scope="module")
def loaded():
    return policy.load(PRETRAINED)


def close(got, expected: np.ndarray, name: str) -> None:
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} vs {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected, err_msg=name)
    else:
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4, err_msg=name)


def model_batch(loaded, ref, with_actions: bool = True) -> tuple[dict, dict]:
    cols = {f"image/{cam}": ref[f"raw.{cam}"] for cam in CAMERAS}
    cols["state"] = ref["raw.observation.state"]
    cols["task"] = np.array(TASKS, dtype=object)
    if with_actions:
        cols["actions"] = ref["raw.action"]
        cols["action_is_pad"] = ref["raw.action_is_pad"]
    encoded = loaded.processor.encode(cols)
    return encoded, loaded.processor.collate(encoded, "cpu")


def test_weights_load_key_for_key(loaded):
    theirs = load_file(str(PRETRAINED / "model.safetensors"))
    listed = json.loads((FIXTURE / "reference.json").read_text())["state_dict"]
    assert sorted(theirs) == sorted(e["key"] for e in listed)
    ours = loaded.model.state_dict()
    assert len(ours) == len(theirs)  # nothing missing, nothing left over
    family = get_family("smolvla")
    mapping = family.checkpoint_keys(PRETRAINED, loaded.model)
    for name, key in mapping.items():
        assert torch.equal(ours[name], theirs[key]), name


def test_preprocessing_matches(loaded, ref):
    encoded, batch = model_batch(loaded, ref)
    close(encoded["state"][:, :6], ref["pre.observation.state"], "pre.state")
    close(encoded["actions"], ref["pre.action"], "pre.action")
    close(batch["lang_tokens"], ref["pre.observation.language.tokens"], "tokens")
    close(batch["lang_masks"], ref["pre.observation.language.attention_mask"], "mask")
    for cam in CAMERAS:
        close(batch["images"][cam], ref[f"model_in.{cam}"], f"model_in.{cam}")
        close(batch["image_masks"][cam], ref[f"model_in.{cam}_mask"], f"{cam}_mask")
    close(batch["state"], ref["model_in.state"], "model_in.state")
    close(batch["actions"], ref["model_in.action"], "model_in.action")


def test_prefix_matches(loaded, ref):
    _, batch = model_batch(loaded, ref)
    with torch.no_grad():
        for cam in CAMERAS:
            got = loaded.model.embed_image(batch["images"][cam])
            close(got, ref[f"inter.img_emb.{cam}"], cam)
        embs, pads, marks = loaded.model.embed_prefix(batch)
    close(embs, ref["inter.prefix_embs"], "prefix_embs")
    close(pads, ref["inter.prefix_pad_masks"], "pad masks")
    close(marks, ref["inter.prefix_att_masks"], "att masks")


def test_sampling_matches_every_euler_step(loaded, ref):
    _, batch = model_batch(loaded, ref, with_actions=False)
    trace: list[torch.Tensor] = []
    actions = loaded.model.sample_actions(batch, torch.from_numpy(ref["sample.noise"]), trace)
    close(torch.stack(trace), ref["sample.v_t"], "sample.v_t")
    close(actions, ref["sample.actions"], "sample.actions")
    x, steps = [torch.from_numpy(ref["sample.noise"])], len(trace)
    for v in trace:
        x.append(x[-1] - v / steps)
    close(torch.stack(x), ref["sample.x_t"], "sample.x_t")


def test_training_losses_match(loaded, ref):
    _, batch = model_batch(loaded, ref)
    noise, time = torch.from_numpy(ref["train.noise"]), torch.from_numpy(ref["train.time"])
    t = time[:, None, None]
    x_t = t * noise + (1 - t) * batch["actions"]
    close(x_t, ref["train.x_t"], "train.x_t")
    close(noise - batch["actions"], ref["train.u_t"], "train.u_t")
    with torch.no_grad():
        close(loaded.model.velocity(batch, x_t, time), ref["train.v_t"], "train.v_t")
        losses = loaded.model.flow_losses(batch, noise, time)
        close(losses, ref["train.losses"], "train.losses")
        close(losses.mean(), ref["train.loss_mean"], "train.loss_mean")
        per_sample = loaded.model(batch, noise, time)
    close(per_sample, ref["policy_forward.per_sample_loss"], "per-sample loss")
    valid = ~batch["action_is_pad"]
    scalar = (losses[..., :6] * valid[..., None]).sum() / (valid.sum() * 6)
    close(scalar, ref["policy_forward.loss"], "policy_forward.loss")
    seeded = (torch.from_numpy(ref["policy_forward_seeded.noise"]), None)
    seeded = (seeded[0], torch.from_numpy(ref["policy_forward_seeded.time"]))
    with torch.no_grad():
        losses = loaded.model.flow_losses(batch, *seeded)[..., :6] * valid[..., None]
    close(losses.sum() / (valid.sum() * 6), ref["policy_forward_seeded.loss"], "seeded loss")


def test_pipeline_matches_with_lerobot_batches(loaded, ref):
    batch = {cam: torch.from_numpy(ref[f"raw.{cam}"]) for cam in CAMERAS}
    batch["observation.state"] = torch.from_numpy(ref["raw.observation.state"])
    batch["task"] = TASKS
    out = loaded.predict_action_chunk(batch, noise=torch.from_numpy(ref["sample.noise"]))
    close(out, ref["pipeline.action_chunk"], "pipeline.action_chunk")
    normalized = loaded.processor.normalizer.normalize("action", out)
    close(normalized, ref["pipeline.action_chunk_normalized"], "normalized chunk")
    seeded = loaded.predict_action_chunk(
        batch, noise=torch.from_numpy(ref["pipeline_seeded.noise"])
    )
    close(seeded[:, 0], ref["pipeline_seeded.select_action"], "select_action")
    queue = loaded.processor.normalizer.normalize("action", seeded)
    close(queue, ref["pipeline_seeded.select_action_queue_normalized"], "action queue")


def _centred_pad(img, height, width, pad_value):
    h, w = img.shape[2:]
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = torch.nn.functional.interpolate(img, size=(new_h, new_w), mode="bilinear")
    top, left = (height - new_h) // 2, (width - new_w) // 2
    pad = (left, width - new_w - left, top, height - new_h - top)
    return torch.nn.functional.pad(resized, pad, value=pad_value)


def _cos_sin(time, dim, min_period, max_period):
    emb = ORIGINAL["time_embedding"](time, dim, min_period, max_period)
    return torch.cat([emb[:, dim // 2 :], emb[:, : dim // 2]], dim=-1)


ORIGINAL: dict = {}


@pytest.mark.parametrize(
    "mistake",
    ["rope_base_100000", "centred_image_padding", "no_sqrt_scaling", "cos_sin_time", "no_state"],
)
def test_each_known_mistake_breaks_the_match(loaded, ref, monkeypatch, mistake):
    """The comparison above would catch each mistake the fixture's README lists."""
    from raytrain_vla.models.smolvla import layers, model, processor

    ORIGINAL["time_embedding"] = layers.time_embedding
    if mistake == "rope_base_100000":
        rope = layers.apply_rope
        monkeypatch.setattr(layers, "apply_rope", lambda x, p: rope(x, p, base=100_000))
    elif mistake == "centred_image_padding":
        monkeypatch.setattr(processor, "resize_with_pad", _centred_pad)
    elif mistake == "no_sqrt_scaling":
        monkeypatch.setattr(model, "math", type("M", (), {"sqrt": staticmethod(lambda x: 1.0)}))
    elif mistake == "cos_sin_time":
        monkeypatch.setattr(model, "time_embedding", _cos_sin)
    _, batch = model_batch(loaded, ref, with_actions=False)
    if mistake == "no_state":
        batch["state"] = torch.zeros_like(batch["state"])
    actions = loaded.model.sample_actions(batch, torch.from_numpy(ref["sample.noise"]))
    error = float((actions - torch.from_numpy(ref["sample.actions"])).abs().max())
    assert error > 1e-2, f"{mistake} moved the actions by only {error}"
    assert math.isfinite(error)


def test_lerobot_export_round_trip_is_exact(loaded, tmp_path):
    family = get_family("smolvla")
    out = family.write_foreign(
        "lerobot", tmp_path / "pretrained_model", loaded.model.state_dict(),
        loaded.model.config, loaded.processor.normalizer,
    )  # fmt: skip
    for original in sorted(PRETRAINED.iterdir()):
        written = out / original.name
        if original.suffix == ".safetensors":
            a, b = load_file(str(original)), load_file(str(written))
            assert sorted(a) == sorted(b), original.name
            for key in a:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert json.loads(original.read_text()) == json.loads(written.read_text()), original
    # Besides LeRobot's files: the relative `vlm_model_name` ("vlm") as a folder of the VLM's
    # config and tokenizer, so the export loads wherever it is copied.
    extra = {p.name for p in out.iterdir()} - {p.name for p in PRETRAINED.iterdir()}
    assert extra == {"vlm"} and (out / "vlm" / "tokenizer.json").is_file()


def test_relative_vlm_name_resolves_from_the_working_directory_first(monkeypatch, tmp_path):
    monkeypatch.chdir(FIXTURE)  # LeRobot's way: "vlm" is relative to the working directory
    assert Path(policy.load(PRETRAINED).model.config.vlm_path) == FIXTURE / "vlm"
    monkeypatch.chdir(tmp_path)  # elsewhere: next to the policy directory
    assert Path(policy.load(PRETRAINED).model.config.vlm_path) == FIXTURE / "vlm"
    assert os.getcwd() == str(tmp_path)


def _spec(cameras=("observation.image",), chunk=10) -> DataSpec:
    return DataSpec({c: (3, 48, 64) for c in cameras}, state_dim=2, action_dim=2, chunk_size=chunk)


def test_fine_tuning_config_maps_cameras_and_keeps_the_architecture():
    family = get_family("smolvla")
    options = SmolVLAOptions(cameras={"observation.images.wrist": "observation.image"})
    config = family.resolve_config(options, _spec(), str(PRETRAINED))
    assert config.cameras == tuple(CAMERAS)
    assert config.camera_sources == ("", "observation.image")
    assert (config.num_vlm_layers, config.state_dim, config.chunk_size) == (4, 2, 10)
    assert config.n_action_steps == 10
    with pytest.raises(ValueError, match="num_vlm_layers=2 .checkpoint: 4"):
        family.resolve_config(SmolVLAOptions(num_vlm_layers=2), _spec(), str(PRETRAINED))
    with pytest.raises(ValueError, match="no dataset camera feeds the model"):
        family.resolve_config(SmolVLAOptions(), _spec(), str(PRETRAINED))
    with pytest.raises(ValueError, match="name no dataset camera"):
        family.resolve_config(
            SmolVLAOptions(cameras={"observation.images.front": "top"}), _spec(), str(PRETRAINED)
        )


def test_a_fresh_model_from_a_vlm_directory_takes_the_dataset_cameras():
    family = get_family("smolvla")
    options = SmolVLAOptions(vlm_path=str(FIXTURE / "vlm"), num_vlm_layers=2)
    config = family.resolve_config(options, _spec(("a", "b")))
    assert config.cameras == ("a", "b") and config.camera_sources == ("a", "b")
    model = family.build(config)
    assert len(model.layers) == 2
    roles = {model.role_of(n) for n, _ in model.named_parameters()}
    assert roles == {"vision", "adapter", "language", "backbone", "action_expert", "state"}
    frozen = model.frozen_parameters()  # LeRobot's defaults: the expert and state_proj train
    assert all(model.role_of(n) not in ("action_expert", "state") for n in frozen)
    assert any(model.role_of(n) == "backbone" for n in frozen)
    with pytest.raises(ValueError, match="vlm_path' is required"):
        family.resolve_config(SmolVLAOptions(), _spec())


def test_a_checkpoint_with_vlm_weights_runs_its_vlm_in_bf16_and_training_says_so(tmp_path):
    import shutil

    copy = tmp_path / "pretrained_model"
    shutil.copytree(PRETRAINED, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "load_vlm_weights": True}))
    shutil.copytree(FIXTURE / "vlm", tmp_path / "vlm")  # "vlm" next to the policy directory
    loaded = policy.load(copy)
    assert {p.dtype for p in loaded.model.vlm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in loaded.model.layers[0].vlm.parameters()} == {torch.bfloat16}
    assert loaded.model.action_in_proj.weight.dtype == torch.float32  # the expert stays fp32
    family = get_family("smolvla")
    options = SmolVLAOptions(cameras={"observation.images.front": "observation.image"})
    trained = family.resolve_config(options, _spec(), str(copy))
    assert trained.vlm_dtype == "float32"
    assert any("bfloat16" in note and "float32" in note for note in family.notes(trained))
    assert family.notes(family.resolve_config(options, _spec(), str(PRETRAINED))) == []


def test_a_vlm_directory_with_weights_loads_them_into_a_fresh_model(tmp_path):
    """A SmolVLM saved by transformers (`save_pretrained`, sharded safetensors) is the
    starting VLM of `model.smolvla.vlm_path`; text layers past num_vlm_layers are not used."""
    import shutil

    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    from raytrain_vla.train.init_source import build_init_source

    torch.manual_seed(3)
    vlm = SmolVLMForConditionalGeneration(SmolVLMConfig.from_pretrained(FIXTURE / "vlm"))
    vlm.save_pretrained(tmp_path / "vlm", max_shard_size="200KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        shutil.copy(FIXTURE / "vlm" / name, tmp_path / "vlm" / name)
    assert len(list((tmp_path / "vlm").glob("*.safetensors"))) > 1
    family = get_family("smolvla")
    options = SmolVLAOptions(vlm_path=str(tmp_path / "vlm"), num_vlm_layers=3)
    config = family.resolve_config(options, _spec())
    assert config.load_vlm_weights
    model = build_init_source(family, config, seed=0)
    theirs = vlm.state_dict()
    ours = model.state_dict()
    assert torch.equal(ours["vlm.model.vision_model.embeddings.patch_embedding.weight"],
                       theirs["model.vision_model.embeddings.patch_embedding.weight"])  # fmt: skip
    assert torch.equal(ours["layers.2.vlm.mlp.up_proj.weight"],
                       theirs["model.text_model.layers.2.mlp.up_proj.weight"])  # fmt: skip
    assert torch.equal(ours["vlm.lm_head.weight"], theirs["lm_head.weight"])
    assert len(model.layers) == 3


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model.type=smolvla"], "'model.smolvla.vlm_path' is required"),
        (["--model.type=smolvla", "--model.smolvla.vlm_path=/nonexistent"], "no readable SmolVLM"),
        (
            [f"--model.init_from={PRETRAINED}", "--model.smolvla.num_vlm_layers=2"],
            "num_vlm_layers=2 (checkpoint: 4)",
        ),  # fmt: skip
        (
            [
                f"--model.init_from={PRETRAINED}",
                "--model.smolvla.cameras={wrong: observation.image}",
            ],
            "['wrong'] are not cameras of the model",
        ),  # fmt: skip
        (
            [
                f"--model.init_from={PRETRAINED}",
                "--model.lora.r=4",
                "--model.smolvla.train_expert_only=true",
            ],
            "freezes the whole VLM",
        ),  # fmt: skip
    ],
)
def test_bad_smolvla_options_exit_2_before_ray_starts(args, fragment, capsys):
    from raytrain_vla import run

    if args[0].startswith("--model.init_from"):
        args = ["--model.type=smolvla", *args]
    assert run.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_in_a_mixture_a_missing_camera_and_padded_action_dims_count_for_nothing(loaded, ref):
    """Mixture columns (`data/embodiment.py`): sample 1 lacks the wrist camera and has only
    two action dims; its loss ignores that camera's pixels and the other dims."""
    encoded, _ = model_batch(loaded, ref)
    n, dims = len(encoded["state"]), loaded.processor.action_dim
    encoded["image_mask/observation.images.wrist"] = np.array([True, False])
    encoded["action_dim_mask"] = np.arange(dims)[None] < np.array([[dims], [2]])
    batch = loaded.processor.collate(encoded, "cpu")
    assert batch["image_masks"]["observation.images.wrist"].tolist() == [True, False]
    noise = torch.as_tensor(ref["train.noise"])
    time = torch.as_tensor(ref["train.time"])
    model = loaded.model
    loss = model(batch, noise, time)
    per_dim = model.flow_losses(batch, noise, time)[:, :, :dims]
    valid = ~batch["action_is_pad"][1]
    expect = per_dim[1, :, :2][valid].mean()
    torch.testing.assert_close(loss[1], expect)
    wrist = "observation.images.wrist"
    changed = dict(batch, images=dict(batch["images"]))
    changed["images"][wrist] = batch["images"][wrist].clone()
    changed["images"][wrist][1] = torch.rand_like(changed["images"][wrist][1])
    torch.testing.assert_close(model(changed, noise, time)[1], loss[1])
    assert n == 2
