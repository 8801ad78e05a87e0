"""An exported policy loads without Ray, checks observations and resizes camera images."""

import json

import numpy as np
import pytest
import torch

from raytrain_vla import policy
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.policy.format import CONFIG, PolicyMeta, read_meta, write_policy

STATS = {
    "observation.state": {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
    "action": {"mean": [0.0, 0.0], "std": [0.03, 0.03]},
}


# What format 1 stored in config.json: the model builder's keyword arguments.
V1_KWARGS = {
    "size": "tiny",
    "camera_keys": ["observation.image"],
    "image_size": [16, 16],
    "state_dim": 2,
    "action_dim": 2,
    "chunk_size": 8,
    "max_text_len": 48,
    "num_inference_steps": 4,
}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    config = FlowVLAConfig.from_size("tiny", image_size=(16, 16), num_inference_steps=4)
    spec = DataSpec({"observation.image": (3, 16, 16)}, state_dim=2, action_dim=2, chunk_size=8)
    meta = PolicyMeta("flow_vla", config, spec, ("reach the red disc",), (0.0, 0.0))
    torch.manual_seed(0)
    model = FlowVLA(config)
    out = tmp_path_factory.mktemp("policy") / "export"
    write_policy(out, model.state_dict(), meta, Normalizer.from_stats(STATS, "mean_std"))
    return out


def test_config_json_holds_the_typed_model_config(policy_dir):
    data = json.loads((policy_dir / CONFIG).read_text())
    assert (data["format"], data["version"], data["model_type"]) == (
        "raytrain_vla.policy",
        2,
        "flow_vla",
    )
    assert data["model_config"]["image_size"] == [16, 16] and data["model_config"]["d_model"] == 64
    meta = read_meta(policy_dir / CONFIG)
    assert meta.model_config == FlowVLAConfig.from_size(
        "tiny", image_size=(16, 16), num_inference_steps=4
    )
    assert meta.data_spec.camera_shapes == {"observation.image": (3, 16, 16)}


def test_a_format_1_policy_still_loads_and_predicts_the_same(policy_dir, tmp_path):
    old = tmp_path / "v1"
    old.mkdir()
    for name in ("model.safetensors", "normalization.json"):
        (old / name).write_bytes((policy_dir / name).read_bytes())
    v1 = {"model_type": "flow_vla", "model_kwargs": V1_KWARGS, "mean_action": [0.0, 0.0]}
    (old / CONFIG).write_text(json.dumps({**v1, "tasks": ["reach the red disc"]}))
    obs = {
        "observation.image": np.full((16, 16, 3), 60, np.uint8),
        "state": [0.4, 0.6],
        "instruction": "reach the red disc",
    }
    np.testing.assert_array_equal(
        policy.load(old, seed=2).predict_action(obs),
        policy.load(policy_dir, seed=2).predict_action(obs),
    )
    assert policy.load(old).meta.model_config == read_meta(policy_dir / CONFIG).model_config


def test_unknown_model_type_names_the_file(policy_dir, tmp_path):
    data = json.loads((policy_dir / CONFIG).read_text())
    (tmp_path / CONFIG).write_text(json.dumps({**data, "model_type": "nope"}))
    with pytest.raises(ValueError, match=r"config.json: .*unknown model type 'nope'"):
        read_meta(tmp_path / CONFIG)


def test_predicts_in_original_units_from_any_image_layout(policy_dir):
    p = policy.load(policy_dir, seed=3)
    hwc = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    obs = {"state": [0.4, 0.6], "instruction": "reach the red disc"}
    a = p.predict_action({"observation.image": hwc, **obs})
    assert a.shape == (8, 2) and np.isfinite(a).all()
    again = policy.load(policy_dir, seed=3).predict_action(
        {"observation.image": hwc.transpose(2, 0, 1), **obs}
    )
    np.testing.assert_array_equal(again, a)
    # The same pixels as [0, 1] floats: resized in float rather than in uint8 (which rounds).
    floats = policy.load(policy_dir, seed=3).predict_action(
        {"observation.image": hwc.transpose(2, 0, 1) / 255.0, **obs}
    )
    np.testing.assert_allclose(floats, a, atol=1e-4)


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


def test_select_action_serves_the_chunk_then_replans_and_reset_restarts(policy_dir):
    obs = {
        "observation.image": np.zeros((16, 16, 3), np.uint8),
        "state": np.array([0.4, 0.6], np.float32),
        "instruction": "reach the red disc",
    }
    p = policy.load(policy_dir, seed=5, n_action_steps=3)
    chunk = policy.load(policy_dir, seed=5).predict_action(obs)
    first = [p.select_action(obs) for _ in range(3)]
    np.testing.assert_allclose(np.stack(first), chunk[:3], atol=1e-6)  # one chunk, in order
    fourth = p.select_action(obs)  # the queue ran dry: a new chunk from fresh noise
    assert fourth.shape == (2,) and not np.allclose(fourth, chunk[3])
    p.reset()
    np.testing.assert_allclose(p.select_action(obs), chunk[0], atol=1e-6)


def test_closed_loop_scores_the_same_scenes_for_every_controller(policy_dir):
    from raytrain_vla.sim.closed_loop import evaluate

    p = policy.load(policy_dir, seed=0, n_action_steps=4)
    results = {r.name: r for r in evaluate(p, episodes=2, seed=7, image_size=16)}
    assert set(results) == {"policy", "random", "instruction_blind"}
    for r in results.values():
        assert r.episodes == 2 and 0.0 <= r.success_rate <= 1.0 and r.mean_final_distance >= 0
        assert 1 <= r.mean_steps <= 40


def test_eval_cli_reports_json_and_refuses_a_bad_policy_directory(policy_dir, tmp_path, capsys):
    import json

    from raytrain_vla import eval as eval_cli

    assert eval_cli.main([str(policy_dir), "--episodes", "1", "--n-action-steps", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"policy", "random", "instruction_blind"}
    assert eval_cli.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a policy directory" in err[0]


def test_recorded_rollouts_hold_every_frame_and_strip_into_one_image(policy_dir):
    from raytrain_vla.sim.closed_loop import evaluate, frame_strip

    p = policy.load(policy_dir, seed=0)
    results = evaluate(p, episodes=3, seed=7, image_size=16, record=2)
    rollouts = results[0].rollouts
    assert len(rollouts) == 2 and all(not r.rollouts for r in results[1:])
    for r in rollouts:
        assert r.frames.dtype == np.uint8 and r.frames.shape[1:] == (16, 16, 3)
        assert 2 <= len(r.frames) <= 41  # the reset frame, then one per step
        assert r.instruction and r.final_distance >= 0
    strip = frame_strip(rollouts[0].frames, max_frames=4)
    count = min(4, len(rollouts[0].frames))
    assert strip.shape == (16, 16 * count + 2 * (count - 1), 3)
    np.testing.assert_array_equal(strip[:, :16], rollouts[0].frames[0])
    np.testing.assert_array_equal(strip[:, -16:], rollouts[0].frames[-1])
    assert "rollouts" not in results[0].to_dict()


def test_only_the_simulators_own_data_counts_as_the_demo_task(tmp_path):
    from raytrain_vla.data.demo import write_demo_dataset
    from raytrain_vla.sim.closed_loop import is_demo_dataset

    assert is_demo_dataset(write_demo_dataset(tmp_path / "demo", num_episodes=1))
    other = tmp_path / "other" / "meta"
    other.mkdir(parents=True)
    (other / "info.json").write_text('{"robot_type": "so100"}')
    assert not is_demo_dataset(other.parent) and not is_demo_dataset(tmp_path / "missing")


def test_an_export_is_fsynced_file_by_file_before_it_is_renamed_into_place(
    policy_dir, tmp_path, monkeypatch
):
    """A power cut after the rename must not leave a complete-looking export of empty files."""
    import os

    from raytrain_vla.common import atomic

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    out = tmp_path / "export"
    meta = read_meta(policy_dir / CONFIG)
    weights = policy.load(policy_dir).model.state_dict()
    write_policy(out, weights, meta, Normalizer.from_stats(STATS, "mean_std"))
    renamed = events.index(("replace", str(out)))
    synced = {os.path.basename(p) for kind, p in events[:renamed] if kind == "fsync"}
    assert {p.name for p in out.iterdir()} <= synced
    assert ("fsync", str(tmp_path)) in events[renamed:]  # the rename itself


def lerobot_observation(batch: int) -> dict:
    """LeRobot's batch: (B, 3, H, W) float images in [0, 1], (B, S) state, B task strings."""
    g = torch.Generator().manual_seed(7)
    return {
        "observation.image": torch.rand((batch, 3, 16, 16), generator=g),
        "observation.state": torch.rand((batch, 2), generator=g),
        "task": ["reach the red disc", "reach the blue disc", "go to the green disc"][:batch],
    }


def test_lerobot_keys_batched_tensors_and_unbatched_numpy_give_the_same_actions(policy_dir):
    batch = lerobot_observation(3)
    noise = torch.randn((3, 8, 2), generator=torch.Generator().manual_seed(1))
    p = policy.load(policy_dir)
    chunks = p.predict_action_chunk(batch, noise=noise)
    assert isinstance(chunks, torch.Tensor) and chunks.shape == (3, 8, 2)
    for i in range(3):
        one = {
            "observation.image": batch["observation.image"][i].numpy(),
            "observation.state": batch["observation.state"][i].numpy(),
            "task": batch["task"][i],
        }
        chunk = p.predict_action_chunk(one, noise=noise[i : i + 1])
        assert isinstance(chunk, np.ndarray) and chunk.shape == (8, 2)
        np.testing.assert_allclose(chunk, chunks[i].numpy(), atol=1e-5)
        # The names of earlier versions are aliases of LeRobot's.
        old = {"observation.image": one["observation.image"], "state": one["observation.state"]}
        again = p.predict_action_chunk({**old, "instruction": one["task"]}, noise=noise[i : i + 1])
        np.testing.assert_array_equal(again, chunk)


def test_select_action_on_a_batch_returns_one_action_per_observation(policy_dir):
    batch = lerobot_observation(2)
    p = policy.load(policy_dir, seed=4, n_action_steps=2)
    chunk = policy.load(policy_dir, seed=4).predict_action_chunk(batch)
    first, second = p.select_action(batch), p.select_action(batch)
    assert first.shape == (2, 2)
    torch.testing.assert_close(torch.stack([first, second], 1), chunk[:, :2])
    p.reset()
    torch.testing.assert_close(p.select_action(batch), chunk[:, 0])


def test_a_batch_whose_parts_disagree_is_refused(policy_dir):
    batch = lerobot_observation(2)
    with pytest.raises(ValueError, match="'task': 1 strings for a batch of 2"):
        policy.load(policy_dir).predict_action_chunk({**batch, "task": ["x"]})
    with pytest.raises(ValueError, match="observation.image': 1 images for a batch of 2"):
        policy.load(policy_dir).predict_action_chunk(
            {**batch, "observation.image": batch["observation.image"][:1]}
        )


def test_device_is_where_the_model_runs_and_the_seed_gives_the_same_actions(policy_dir):
    p = policy.load(policy_dir, seed=2, device="cpu")
    assert p.device == torch.device("cpu")
    assert {t.device for t in p.model.parameters()} == {torch.device("cpu")}
    batch = lerobot_observation(2)
    torch.testing.assert_close(
        p.predict_action_chunk(batch), policy.load(policy_dir, seed=2).predict_action_chunk(batch)
    )
    assert policy.load(policy_dir, device="meta").device == torch.device("meta")


def test_save_pretrained_and_from_pretrained_round_trip(policy_dir, tmp_path):
    p = policy.Policy.from_pretrained(str(policy_dir), seed=6)
    out = tmp_path / "saved"
    p.save_pretrained(out)
    again = policy.Policy.from_pretrained(out, seed=6)
    batch = lerobot_observation(2)
    torch.testing.assert_close(again.predict_action_chunk(batch), p.predict_action_chunk(batch))
    p.save_pretrained(out)  # a policy directory is replaced as a whole
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a policy directory"):
        p.save_pretrained(other)
    assert (other / "mine.txt").read_text() == "keep"


def _model_inputs(p: policy.Policy, monkeypatch) -> list[dict]:
    """Every batch `p.model.sample_actions` receives, so a test sees what the model sees."""
    seen: list[dict] = []
    sample = p.model.sample_actions

    def spy(batch, noise, *args, **kwargs):
        seen.append(batch)
        return sample(batch, noise, *args, **kwargs)

    monkeypatch.setattr(p.model, "sample_actions", spy)
    return seen


def _frames_and_state(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(2, 3, 24, 20) frames (resized to the policy's 16x16), a state and noise."""
    g = torch.Generator().manual_seed(11)
    frames = torch.rand((2, 3, 24, 20), generator=g)
    if dtype == torch.uint8:
        frames = (frames * 255).round().to(torch.uint8)
    else:  # a simulator's render: values between the 1/255 steps of a uint8 camera
        assert not torch.equal(frames, (frames * 255).round() / 255)
    return frames, torch.rand((2, 2), generator=g), torch.randn((2, 8, 2), generator=g)


def test_float_frames_reach_the_model_as_given_not_rounded_to_uint8(policy_dir, monkeypatch):
    frames, state, noise = _frames_and_state(torch.float32)
    tasks = ["reach the red disc", "reach the blue disc"]
    p = policy.load(policy_dir)
    # The model fed those exact floats: the training path's state and tokens, the frames
    # resized in float (bilinear, antialiased, as `resize_images` resizes uint8).
    cols = {"image/observation.image": np.zeros((2, 3, 16, 16), np.uint8), "state": state.numpy()}
    direct = p.processor.collate(p.processor.encode({**cols, "task": np.array(tasks)}), "cpu")
    direct["images"]["observation.image"] = torch.nn.functional.interpolate(
        frames, size=(16, 16), mode="bilinear", antialias=True, align_corners=False
    )
    expected = p.processor.decode_actions(p.model.sample_actions(direct, noise))
    seen = _model_inputs(p, monkeypatch)
    got = p.predict_action_chunk(
        {"observation.image": frames, "observation.state": state, "task": tasks}, noise=noise
    )
    assert torch.equal(
        seen[0]["images"]["observation.image"], direct["images"]["observation.image"]
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # Unbatched HWC floats (numpy) take the same path.
    one = {"observation.image": frames[0].permute(1, 2, 0).numpy(), "state": state[0].numpy()}
    chunk = p.predict_action_chunk({**one, "task": tasks[0]}, noise=noise[:1])
    np.testing.assert_allclose(chunk, got[0].numpy(), atol=1e-6)  # batch of 1 vs 2


def test_uint8_frames_take_the_training_path_bit_for_bit(policy_dir, monkeypatch):
    frames, state, noise = _frames_and_state(torch.uint8)
    tasks = ["reach the red disc", "reach the blue disc"]
    p = policy.load(policy_dir)
    # What read tasks and the trainer hand the model: uint8 resized, then scaled by 1/255.
    cols = {"image/observation.image": frames.numpy(), "state": state.numpy()}
    training = p.processor.collate(p.processor.encode({**cols, "task": np.array(tasks)}), "cpu")
    expected = p.processor.decode_actions(p.model.sample_actions(training, noise))
    seen = _model_inputs(p, monkeypatch)
    hwc = frames.permute(0, 2, 3, 1)  # a camera's layout
    got = p.predict_action_chunk(
        {"observation.image": hwc, "observation.state": state, "task": tasks}, noise=noise
    )
    image = seen[0]["images"]["observation.image"]
    assert torch.equal(image, training["images"]["observation.image"])
    assert torch.equal(image * 255, (image * 255).round())  # still 1/255 steps
    assert torch.equal(got, expected)


def test_images_of_another_integer_type_are_refused_naming_the_camera(policy_dir):
    obs = {"observation.image": np.full((16, 16, 3), 60), "state": [0.4, 0.6], "task": "x"}
    with pytest.raises(ValueError, match="camera 'observation.image': expected uint8 .*int64"):
        policy.load(policy_dir).predict_action(obs)


def test_smolvla_float_frames_give_lerobots_actions_for_those_exact_floats(monkeypatch):
    """LeRobot's SmolVLA resizes the float frames it is given (`resize_with_pad`, bilinear, pad
    left/top, then [-1, 1]); the fixture's inputs are uint8/255, so the float frames here are
    prepared by LeRobot's recipe, first checked against the fixture's `model_in.*`."""
    import torch.nn.functional as F
    from _paths import fixtures_root

    fixture = fixtures_root() / "lerobot_smolvla_tiny"
    ref = np.load(fixture / "reference.npz")
    cameras = ["observation.images.front", "observation.images.wrist"]

    def lerobot_prepare(x: torch.Tensor) -> torch.Tensor:  # 48x64 -> 24x32, 8 rows on top
        resized = F.interpolate(x, size=(24, 32), mode="bilinear", align_corners=False)
        return F.pad(resized, (0, 0, 8, 0), value=0.0) * 2.0 - 1.0

    raw = {c: torch.from_numpy(ref[f"raw.{c}"]) for c in cameras}
    for c in cameras:
        torch.testing.assert_close(lerobot_prepare(raw[c]), torch.from_numpy(ref[f"model_in.{c}"]))
    frames = {c: raw[c] * 0.97 + 0.0123 for c in cameras}  # a user's own colour correction
    assert not torch.equal(frames[cameras[0]] * 255, (frames[cameras[0]] * 255).round())
    state, noise = ref["raw.observation.state"], torch.from_numpy(ref["sample.noise"])
    tasks = ["pick up the red cube", "open the drawer"]
    p = policy.load(fixture / "pretrained_model")
    cols = {f"image/{c}": ref[f"raw.{c}"] for c in cameras}
    direct = p.processor.collate(
        p.processor.encode({**cols, "state": state, "task": np.array(tasks)}), "cpu"
    )
    direct["images"] = {cam: lerobot_prepare(frames[s]) for cam, s in p.processor.sources.items()}
    expected = p.processor.decode_actions(p.model.sample_actions(direct, noise))
    seen = _model_inputs(p, monkeypatch)
    got = p.predict_action_chunk(
        {**frames, "observation.state": torch.from_numpy(state), "task": tasks}, noise=noise
    )
    assert set(seen[0]["images"]) == set(direct["images"])
    for cam, image in direct["images"].items():
        torch.testing.assert_close(seen[0]["images"][cam], image, rtol=0, atol=1e-7)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_a_lerobot_policy_replans_as_its_own_config_says(tmp_path):
    """`lerobot-eval` executes `n_action_steps` of each chunk (LeRobot's config.json); a given
    value wins over it."""
    import shutil

    from _paths import fixtures_root

    fixture = fixtures_root() / "lerobot_smolvla_tiny"
    pretrained = tmp_path / "pretrained_model"
    shutil.copytree(fixture / "pretrained_model", pretrained)
    (tmp_path / "vlm").symlink_to(fixture / "vlm")  # its VLM, found next to it
    config = json.loads((pretrained / "config.json").read_text())
    assert config["n_action_steps"] == config["chunk_size"] > 3
    config["n_action_steps"] = 3
    (pretrained / "config.json").write_text(json.dumps(config))
    assert policy.load(pretrained).n_action_steps == 3
    assert policy.load(pretrained, n_action_steps=5).n_action_steps == 5
