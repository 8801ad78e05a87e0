"""LeRobot itself loads a LeRobot-format export and predicts what `raytrain_vla.policy` predicts.

LeRobot 0.6.1 needs Python >= 3.12, so it lives in its own virtual environment; this script
runs there (`--side lerobot`) through a subprocess and compares in ours. LeRobot 0.6.1 pins
torch < 2.12 and torchvision < 0.27, so it goes in without its pins, beside torch 2.13.0 (from
PyPI: the CPU wheel on this disk is for Python 3.11, so Python 3.12 gets the CUDA build, several
GB, which runs on CPU as well):

    python3.12 -m venv /tmp/lrv && /tmp/lrv/bin/pip install torch==2.13.0 transformers==5.5.4 \\
        num2words && /tmp/lrv/bin/pip install --no-deps lerobot==0.6.1
    /tmp/lrv/bin/pip install torch==2.13.0 torchvision==0.28.0 transformers==5.5.4 numpy==2.2.6 \\
        "opencv-python-headless>=4.9,<4.14" "Pillow>=10,<13" "einops>=0.8,<0.9" \\
        "draccus>=0.11.6,<0.12" "huggingface-hub>=1.6,<2" "requests>=2.32,<3" \\
        "gymnasium>=1.1.1,<2" "safetensors>=0.4.3,<1" "packaging>=24.2,<26" "termcolor>=2.4,<4" \\
        "setuptools>=71,<82" "scipy>=1.14,<2" accelerate
    python -m raytrain_vla.export RUN/checkpoint_... OUT/pretrained_model --format lerobot
    python benchmarks/lerobot_crosscheck.py OUT/pretrained_model --lerobot-python /tmp/lrv/bin/python

The policy class follows `config.json`'s `"type"`: smolvla (`SmolVLAPolicy`), pi0
(`PI0Policy`), pi05 (`PI05Policy`), wall_x (`WallXPolicy`; it needs LeRobot's `wallx` extra:
`/tmp/lrv/bin/pip install peft torchdiffeq qwen-vl-utils scipy`, and runs in bf16 as LeRobot
always runs it, so its actions differ from our float32 ones by bf16 rounding). Both sides get the same batch (camera frames in [0, 1] under
the config's VISUAL input features, state, task strings) and the same noise (B, *our model's
`noise_shape`). LeRobot runs `make_pre_post_processors(pretrained_path=...)` +
`.predict_action_chunk(batch, noise=...)` from inside the policy directory (or its parent, when
a relative SmolVLA `vlm_model_name` lies there), after checking that every tensor of the policy
it built equals `model.safetensors` (`from_pretrained` of pi0 / pi0.5 returns the randomly
initialised model when loading fails). Prints JSON with the largest difference.

`--tiny-spec FIXTURE/spec.json` is for the tiny pi0 / pi0.5 fixtures (`lerobot_pi0_tiny`,
`lerobot_pi05_tiny`): LeRobot 0.6.1 only builds the real pi sizes, so the LeRobot side imports
`make_fixture` from that folder and calls `apply_tiny_patch(spec, FIXTURE/tokenizer)` (tiny
dimensions; the preprocessor's `google/paligemma-3b-pt-224` loads FIXTURE/tokenizer) before
building the policy; ours loads with that tokenizer and the spec's SigLIP head count.
`--tokenizer DIR` points both sides of a pi0 / pi0.5 check at a local PaliGemma tokenizer
(LeRobot: `preprocessor_overrides`; it wins over the fixture's tokenizer).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

POLICY_CLASSES = {  # config.json "type" -> LeRobot 0.6.1 policy class
    "smolvla": ("lerobot.policies.smolvla.modeling_smolvla", "SmolVLAPolicy"),
    "pi0": ("lerobot.policies.pi0.modeling_pi0", "PI0Policy"),
    "pi05": ("lerobot.policies.pi05.modeling_pi05", "PI05Policy"),
    "wall_x": ("lerobot.policies.wall_x.modeling_wall_x", "WallXPolicy"),
}
PI_TYPES = ("pi0", "pi05")
TASKS = ["pick up the red cube", "open the drawer"]


def policy_type(policy_dir: str) -> str:
    kind = json.loads((Path(policy_dir) / "config.json").read_text()).get("type")
    if kind not in POLICY_CLASSES:
        raise SystemExit(
            f"{policy_dir}/config.json: type {kind!r}; this check knows {sorted(POLICY_CLASSES)}"
        )
    return kind


def working_dir(policy_dir: str) -> str:
    """Where LeRobot runs: the policy directory, or its parent when a relative SmolVLA
    `vlm_model_name` or Wall-X `pretrained_name_or_path` lies there (the shared fixtures' layout)
    and not inside."""
    config = json.loads((Path(policy_dir) / "config.json").read_text())
    name = config.get("vlm_model_name") or config.get("pretrained_name_or_path") or ""
    parent = Path(policy_dir).parent
    if name and not Path(name).is_absolute() and not (Path(policy_dir) / name).exists():
        if (parent / name).exists():
            return str(parent)
    return policy_dir


def check_weights(policy, policy_dir: str) -> dict:
    """Every tensor of `policy` equals `model.safetensors` (or shares storage with one that
    does: tied weights); SystemExit naming the first differences otherwise."""
    import torch
    from safetensors.torch import load_file

    stored = load_file(str(Path(policy_dir) / "model.safetensors"))
    live = policy.state_dict()
    problems = [f"{k}: in the file, not in the policy" for k in sorted(set(stored) - set(live))]
    checked = set()
    for key in sorted(set(stored) & set(live)):
        mine, theirs = live[key], stored[key]
        if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            problems.append(f"{key}: {tuple(mine.shape)} {mine.dtype} in the policy, "
                            f"{tuple(theirs.shape)} {theirs.dtype} in the file")  # fmt: skip
        elif not torch.equal(mine.cpu(), theirs):
            problems.append(f"{key}: differs from the file (max abs diff "
                            f"{float((mine.cpu().double() - theirs.double()).abs().max()):.3g})")  # fmt: skip
        else:
            checked.add(live[key].data_ptr())
    for key in sorted(set(live) - set(stored)):
        if live[key].data_ptr() not in checked:
            problems.append(f"{key}: in the policy, not in the file")
    if problems:
        raise SystemExit(
            f"LeRobot's {type(policy).__name__} does not hold the weights of {policy_dir}/"
            f"model.safetensors ({len(problems)} tensors):\n  " + "\n  ".join(problems[:20])
        )
    return {"tensors": len(stored), "values": int(sum(t.numel() for t in stored.values()))}


def predict_with_noise(policy, batch: dict, noise):
    """LeRobot's Wall-X `predict_action_chunk` with its one `torch.randn` draw of x_0 (the
    padded (B, chunk, max_action_dim) noise) replaced by `noise`."""
    import torch

    draw = torch.randn

    def given(*size, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
        shape = tuple(kwargs.get("size", shape))
        if shape == tuple(noise.shape):
            return noise.to(kwargs.get("device", "cpu"), kwargs.get("dtype", torch.float32))
        return draw(*size, **kwargs)

    torch.randn = given
    try:
        return policy.predict_action_chunk(batch)
    finally:
        torch.randn = draw


def lerobot_side(policy_dir: str, inputs: str, out: str, tiny_spec: str, tokenizer: str) -> None:
    import torch

    kind = policy_type(policy_dir)
    if tiny_spec:
        spec_path = Path(tiny_spec).resolve()
        sys.path.insert(0, str(spec_path.parent))
        import make_fixture  # the fixture's generator: its dimension-only patch

        make_fixture.apply_tiny_patch(
            json.loads(spec_path.read_text()), spec_path.parent / "tokenizer"
        )
    from lerobot.policies.factory import make_pre_post_processors

    module, name = POLICY_CLASSES[kind]
    policy_cls = getattr(importlib.import_module(module), name)
    os.chdir(working_dir(policy_dir))
    policy = policy_cls.from_pretrained(policy_dir).eval()
    check_weights(policy, policy_dir)
    extra = {}
    if tokenizer:
        extra["preprocessor_overrides"] = {"tokenizer_processor": {"tokenizer_name": tokenizer}}
    pre, post = make_pre_post_processors(policy.config, pretrained_path=policy_dir, **extra)
    data = np.load(inputs, allow_pickle=False)
    batch = {key: torch.from_numpy(data[key]) for key in data.files if key not in ("noise", "task")}
    batch["task"] = [str(t) for t in data["task"]]
    noise = torch.from_numpy(data["noise"])
    with torch.no_grad():
        if kind == "wall_x":  # its sampler draws x_0 with torch.randn and takes no noise
            actions = predict_with_noise(policy, pre(batch), noise)
        else:
            actions = policy.predict_action_chunk(pre(batch), noise=noise)
    np.save(out, post(actions).numpy())


def our_side(
    policy_dir: str, lerobot_python: str, seed: int, tiny_spec: str = "", tokenizer: str = ""
) -> dict:
    import torch

    from raytrain_vla import policy

    kind = policy_type(policy_dir)
    options, load_kwargs, given_tokenizer = {}, {}, tokenizer
    if tiny_spec:
        spec_path = Path(tiny_spec).resolve()
        spec = json.loads(spec_path.read_text())
        options["vision_heads"] = int(spec["vision"]["num_attention_heads"])
        tokenizer = tokenizer or str(spec_path.parent / "tokenizer")
    if tokenizer:
        load_kwargs["tokenizer"] = tokenizer
    ours = policy.load(policy_dir, options=options or None, **load_kwargs)
    features = json.loads((Path(policy_dir) / "config.json").read_text())["input_features"]
    visual = {k: tuple(v["shape"]) for k, v in features.items() if v["type"] == "VISUAL"}
    state_dim = int(features["observation.state"]["shape"][0])
    # The batch is keyed as the robot's data is (before the preprocessor's rename map): the
    # cameras policy.load reads.
    cameras = dict(ours.camera_shapes)
    if len(cameras) != len(visual) or state_dim != ours.state_dim:
        raise SystemExit(
            f"config.json's cameras {visual} / state {state_dim} are not what policy.load "
            f"reads: {ours.camera_shapes} / {ours.state_dim}"
        )
    rng = np.random.default_rng(seed)
    size = 2
    batch: dict = {}
    for key, (c, h, w) in cameras.items():
        batch[key] = rng.integers(0, 256, (size, c, h, w)).astype(np.float32) / 255
    batch["observation.state"] = rng.normal(size=(size, state_dim)).astype(np.float32)
    tasks = np.array(TASKS[:size])
    noise = rng.normal(size=(size, *ours.model.noise_shape)).astype(np.float32)
    command = [lerobot_python, __file__, policy_dir, "--side", "lerobot"]
    if tiny_spec:
        command += ["--tiny-spec", str(Path(tiny_spec).resolve())]
    if given_tokenizer:  # else LeRobot reads the name its preprocessor holds (or the patch's)
        command += ["--tokenizer", str(Path(given_tokenizer).resolve())]
    with tempfile.TemporaryDirectory() as tmp:
        inputs, out = Path(tmp) / "inputs.npz", Path(tmp) / "lerobot.npy"
        np.savez(inputs, **batch, task=tasks, noise=noise)
        subprocess.run(  # its prints go to stderr: stdout holds only the JSON
            command + ["--inputs", str(inputs), "--out", str(out)], check=True, stdout=sys.stderr
        )
        theirs = np.load(out)
    torch_batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    torch_batch["task"] = [str(t) for t in tasks]
    mine = ours.predict_action_chunk(torch_batch, noise=torch.from_numpy(noise)).numpy()
    if mine.shape != theirs.shape:
        raise SystemExit(f"action chunks of shape {mine.shape} (ours), {theirs.shape} (LeRobot)")
    return {
        "policy": policy_dir,
        "type": kind,
        "tiny_spec": str(Path(tiny_spec).resolve()) if tiny_spec else None,
        "shape": list(mine.shape),
        "max_abs_diff": float(np.abs(mine - theirs).max()),
        "max_abs_action": float(np.abs(theirs).max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policy_dir")
    parser.add_argument("--side", choices=["ours", "lerobot"], default="ours")
    parser.add_argument("--lerobot-python", default="")
    parser.add_argument("--tiny-spec", default="", help="a tiny pi0 / pi0.5 fixture's spec.json")
    parser.add_argument("--tokenizer", default="", help="pi0 / pi0.5: a PaliGemma tokenizer dir")
    parser.add_argument("--inputs", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    policy_dir = str(Path(args.policy_dir).resolve())
    if (args.tiny_spec or args.tokenizer) and policy_type(policy_dir) not in PI_TYPES:
        parser.error("--tiny-spec / --tokenizer are for pi0 / pi05 policies")
    if args.side == "lerobot":
        lerobot_side(policy_dir, args.inputs, args.out, args.tiny_spec, args.tokenizer)
        return 0
    if not args.lerobot_python:
        parser.error("--lerobot-python: the python of an environment with lerobot 0.6.1")
    result = our_side(policy_dir, args.lerobot_python, args.seed, args.tiny_spec, args.tokenizer)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
