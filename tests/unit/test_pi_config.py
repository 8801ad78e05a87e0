"""pi0 / pi0.5 options, checked before Ray starts: the tokenizer lookup, the checkpoint's
architecture against the options, the statistics pi0.5's quantile normalisation needs, LoRA
against the freezing options; and LoRA adapters merged on export."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _paths import fixtures_root

from raytrain_vla import policy, run
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.models.pi_gemma.tokenizer import find_tokenizer
from raytrain_vla.models.registry import get_family

PI05 = fixtures_root() / "lerobot_pi05_tiny"
PRETRAINED = PI05 / "pretrained_model"


def test_the_tokenizer_is_found_inside_then_next_to_the_policy_and_its_absence_is_one_error(
    tmp_path, monkeypatch
):
    assert find_tokenizer("", PRETRAINED) == (PI05 / "tokenizer").resolve()
    inside = tmp_path / "policy"
    shutil.copytree(PRETRAINED, inside)
    shutil.copytree(PI05 / "tokenizer", inside / "tokenizer")
    assert find_tokenizer("", inside) == (inside / "tokenizer").resolve()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    bare = tmp_path / "bare" / "pretrained_model"
    shutil.copytree(PRETRAINED, bare)
    with pytest.raises(
        FileNotFoundError, match=r"no PaliGemma tokenizer found.*policy.load\(..., tokenizer=DIR\)"
    ):
        policy.load(bare, options={"vision_heads": 2})
    loaded = policy.load(bare, tokenizer=PI05 / "tokenizer", options={"vision_heads": 2})
    assert loaded.model.config.tokenizer_path == str((PI05 / "tokenizer").resolve())


def test_a_tower_of_another_width_than_so400m_needs_its_head_count():
    with pytest.raises(ValueError, match="vision_heads"):
        policy.load(PRETRAINED)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("pi") / "demo", 6, 0)


def pi05_args(root, tmp_path, *extra: str) -> list[str]:
    return [
        f"--data.root={root}", "--model.type=pi05", f"--model.init_from={PRETRAINED}",
        "--model.pi05.vision_heads=2",
        "--model.pi05.cameras={observation.images.base_0_rgb: observation.image}",
        "--train.global_batch_size=8", "--train.micro_batch_size=4",
        f"--ray.storage_path={tmp_path / 'runs'}", "--ray.run_name=bad", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--model.pi05.depth=4"], "depth=4 (checkpoint: 3)"),
        (["--model.pi05.tokenizer_path=/nowhere"], "'model.pi05.tokenizer_path': /nowhere"),
        (["--model.lora.r=4", "--model.pi05.train_expert_only=true"], "freezes the whole"),
        (["--model.pi05.num_inference_steps=0"], "model.pi05.num_inference_steps"),
        (["--model.type=pi0"], "is a LeRobot 'pi05' policy; model.type is 'pi0'"),
    ],
)
def test_bad_pi_options_exit_2_before_ray_starts(demo, tmp_path, capsys, extra, fragment):
    args = pi05_args(demo, tmp_path, *extra)
    if "--model.type=pi0" in extra:
        args = [a.replace("model.pi05.", "model.pi0.") for a in args if a != "--model.type=pi05"]
    assert run.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "runs" / "bad").exists()


def test_stats_without_quantiles_are_refused_before_ray_with_the_command(demo, tmp_path, capsys):
    copy = tmp_path / "demo"
    shutil.copytree(demo, copy)
    stats_file = copy / "meta" / "stats.json"
    stats = json.loads(stats_file.read_text())
    for feature in stats.values():
        for q in ("q01", "q10", "q50", "q90", "q99"):
            feature.pop(q, None)
    stats_file.write_text(json.dumps(stats))
    assert run.main(pi05_args(copy, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "q01" in err[0] and "raytrain_vla.data stats" in err[0], err


def test_lora_adapts_the_vlm_layers_and_merges_into_lerobot_s_keys(tmp_path):
    from raytrain_vla.config.schema import LoRAConfig

    family = get_family("pi05")
    options = family.tiny_options(fixtures_root())
    spec = DataSpec({"cam": (3, 48, 64)}, state_dim=3, action_dim=2, chunk_size=4)
    config = family.resolve_config(options, spec, lora=LoRAConfig(r=2, alpha=4))
    torch.manual_seed(0)
    model = family.build(config)
    adapters = {n for n in model.state_dict() if ".lora_" in n}
    assert adapters and all(n.startswith("layers.") and ".vlm." in n for n in adapters)
    trained = adapters - model.frozen_parameters()  # the last layer's unused q_proj stays frozen
    assert {n for n in adapters if n.startswith("layers.0.")} <= trained
    frozen_vlm = [n for n in model.frozen_parameters() if ".vlm." in n and ".lora_" not in n]
    assert frozen_vlm  # the base weights train only through the adapters
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    state, merged_config = family.policy_state(model.state_dict(), config)
    assert not merged_config.lora and not any(".lora_" in k or ".base_layer." in k for k in state)
    plain = family.build(merged_config)
    plain.load_state_dict(state)
    from raytrain_vla.models.pi_gemma.lerobot_io import key_map

    assert len(key_map(plain)) == len(state)
    layer = model.layers[0].vlm.self_attn.q_proj
    x = torch.randn(2, layer.in_features)
    torch.testing.assert_close(plain.layers[0].vlm.self_attn.q_proj(x), layer(x))


@pytest.mark.parametrize("variant, tensors", [("pi0", 778), ("pi05", 813)])
def test_at_real_size_the_state_dict_is_lerobot_s(variant, tensors):
    """LeRobot 0.6.1's real pi0 / pi0.5 state dict: 778 / 813 tensors, both LM heads listed
    (untied), built on the meta device."""
    from raytrain_vla.models.pi_gemma.config import DEFAULT_NORM, PiConfig
    from raytrain_vla.models.pi_gemma.lerobot_io import key_map
    from raytrain_vla.models.pi_gemma.model import PiModel

    config = PiConfig(variant=variant, norm_map=DEFAULT_NORM[variant])
    with torch.device("meta"):
        model = PiModel(config)
    keys = key_map(model)
    assert len(keys) == tensors
    shapes = {keys[n]: tuple(p.shape) for n, p in model.state_dict().items()}
    root = "model.paligemma_with_expert."
    assert shapes[f"{root}paligemma.lm_head.weight"] == (257152, 2048)
    assert shapes[f"{root}paligemma.model.language_model.embed_tokens.weight"] == (257152, 2048)
    assert shapes[f"{root}gemma_expert.model.layers.17.mlp.down_proj.weight"] == (1024, 4096)
    vision = f"{root}paligemma.model.vision_tower.vision_model."
    assert shapes[f"{vision}encoder.layers.26.mlp.fc1.weight"] == (4304, 1152)
    assert shapes[f"{vision}embeddings.position_embedding.weight"] == (256, 1152)


def test_select_action_plays_the_chunk_before_predicting_again(monkeypatch):
    import numpy as np

    loaded = policy.load(PRETRAINED, options={"vision_heads": 2})
    calls = []
    predict = loaded._predict
    monkeypatch.setattr(loaded, "_predict", lambda *a: calls.append(1) or predict(*a))
    rng = np.random.default_rng(0)
    observation = {
        "observation.images.base_0_rgb": rng.random((3, 48, 64), dtype=np.float32),
        "observation.images.left_wrist_0_rgb": rng.random((3, 48, 64), dtype=np.float32),
        "observation.state": rng.normal(size=7).astype(np.float32),
        "task": "open the drawer",
    }
    actions = [loaded.select_action(observation) for _ in range(loaded.n_action_steps + 1)]
    assert loaded.n_action_steps == 8 and len(calls) == 2 and actions[0].shape == (5,)
