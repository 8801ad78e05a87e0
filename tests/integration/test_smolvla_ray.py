"""LeRobot's SmolVLA (the tiny fixture) fine-tuned on the demo data on Ray: 2 workers, FSDP2,
LeRobot's `train_expert_only` default. Checkpoints hold only what trains, the LeRobot-format
export predicts exactly what our export predicts, and with LoRA adapters a killed worker costs
nothing (bitwise). The kill is done once, on the LoRA run, for suite time: resuming is the
trainer's, and the LoRA run's checkpoints hold the expert stream as well as the adapters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _runs import short_run_args
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _paths import fixtures_root  # noqa: E402

from raytrain_vla import export, policy, run  # noqa: E402
from raytrain_vla.train.checkpoint import stored_model_keys  # noqa: E402
from raytrain_vla.train.resume import latest_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 8


def smolvla_args(demo_root: Path, storage: Path, name: str, *extra: str) -> list[str]:
    pretrained = fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model"
    return short_run_args(
        demo_root, storage, name, STEPS, "--debug.log_sample_ids=true", "--model.type=smolvla",
        f"--model.init_from={pretrained}",
        "--model.smolvla.cameras={observation.images.front: observation.image}", *extra,
    )  # fmt: skip


def committed_ids(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["rank"]): r["ids"] for r in rows}


@pytest.fixture(scope="module")
def reference(demo_root, tmp_path_factory):
    storage = tmp_path_factory.mktemp("smolvla")
    assert run.main(smolvla_args(demo_root, storage, "reference")) == 0
    return storage / "reference"


def test_checkpoints_hold_only_what_trains(reference):
    checkpoint = latest_checkpoint(reference)
    stored = stored_model_keys(checkpoint)
    # train_expert_only (LeRobot's default): the action expert and the state projection.
    assert stored and all(
        k.startswith(("layers.", "lm_expert.", "action_", "state_proj.")) for k in stored
    ), sorted(stored)[:5]
    assert not any(".vlm." in k or k.startswith("vlm.") for k in stored)
    full = load_file(str(reference / "export" / "model.safetensors"))
    assert len(stored) < len(full)
    pretrained = fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model"
    start = policy.load(pretrained).model.state_dict()
    for name, tensor in full.items():  # frozen weights are LeRobot's, untouched
        if name not in stored:
            np.testing.assert_array_equal(tensor, start[name].numpy(), err_msg=name)


def test_lerobot_format_export_predicts_what_our_export_predicts(reference, tmp_path):
    out = tmp_path / "pretrained_model"
    assert export.main([str(latest_checkpoint(reference)), str(out), "--format", "lerobot"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["type"] == "smolvla" and config["chunk_size"] == 10  # the init_from checkpoint's
    pre = json.loads((out / "policy_preprocessor.json").read_text())
    assert pre["steps"][0]["config"]["rename_map"] == {
        "observation.image": "observation.images.front"
    }
    ours, theirs = policy.load(reference / "export"), policy.load(out)
    images = np.random.default_rng(0).integers(0, 255, (2, 3, 32, 32), dtype=np.uint8)
    batch = {
        "observation.image": torch.from_numpy(images).float() / 255,
        "observation.state": torch.tensor([[0.2, 0.5], [0.7, 0.1]]),
        "task": ["push the red block to the left zone", "push the blue block to the right zone"],
    }
    noise = torch.randn((2, *ours.model.noise_shape), generator=torch.Generator().manual_seed(0))
    expected = ours.predict_action_chunk(batch, noise=noise)
    assert expected.shape == (2, 10, 2)
    assert torch.equal(theirs.predict_action_chunk(batch, noise=noise), expected)


LORA = ("--model.lora.r=4", "--model.lora.alpha=8")


@pytest.fixture(scope="module")
def lora_reference(demo_root, tmp_path_factory):
    storage = tmp_path_factory.mktemp("smolvla_lora")
    assert run.main(smolvla_args(demo_root, storage, "lora", *LORA)) == 0
    return storage / "lora"


def test_lora_trains_adapters_resumes_bitwise_and_exports_merged(
    lora_reference, reference, demo_root, tmp_path
):
    args = smolvla_args(demo_root, tmp_path, "lora_killed", *LORA, "--ray.max_failures=1")
    assert run.main([*args, "--debug.kill_at_step=4", "--debug.kill_rank=0"]) == 0
    run_dir = tmp_path / "lora_killed"
    assert committed_ids(run_dir) == committed_ids(lora_reference)
    stored = stored_model_keys(latest_checkpoint(run_dir))
    adapters = {k for k in stored if ".lora_" in k}
    assert adapters and all(".vlm.self_attn." in k for k in adapters)
    assert not any(".base_layer." in k or k.startswith("vlm.") for k in stored)
    # The checkpoints are the adapters plus what trains without LoRA.
    assert stored - adapters == stored_model_keys(latest_checkpoint(reference))
    ours = load_file(str(run_dir / "export" / "model.safetensors"))
    theirs = load_file(str(lora_reference / "export" / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    assert not any(".lora_" in k or ".base_layer." in k for k in ours)  # merged: no peft needed
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    # The adapters trained: merged VLM weights moved away from LeRobot's.
    pretrained = fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model"
    start = policy.load(pretrained).model.state_dict()
    moved = [
        k
        for k in ours
        if ".vlm.self_attn.v_proj" in k and not np.array_equal(ours[k], start[k].numpy())
    ]
    assert moved
    out = tmp_path / "pretrained_model"
    assert export.main([str(latest_checkpoint(run_dir)), str(out), "--format", "lerobot"]) == 0
    exported = load_file(str(out / "model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in exported)
    assert len(exported) == len(load_file(str(pretrained / "model.safetensors")))


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--model.smolvla.cameras={observation.images.front: top}"], "name no dataset camera"),
        (["--model.lora.r=4", "--model.lora.target_modules=[nothing_proj]"], "nothing_proj"),
        (["--data.image_size=[16, 16]"], "'data.image_size': model type 'smolvla'"),
    ],
)
def test_options_that_do_not_fit_the_data_exit_2_before_ray_starts(
    demo_root, tmp_path, capsys, extra, fragment
):
    args = smolvla_args(demo_root, tmp_path, "bad", *extra)
    assert run.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "bad").exists()  # nothing written
