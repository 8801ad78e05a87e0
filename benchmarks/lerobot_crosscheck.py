"""LeRobot itself loads a LeRobot-format export and predicts what `raytrain_vla.policy` predicts.

LeRobot 0.6.1 needs Python >= 3.12, so it lives in its own virtual environment; this script
runs there (`--side lerobot`) through a subprocess and compares in ours:

    python3.12 -m venv /tmp/lrv && /tmp/lrv/bin/pip install torch==2.13.0 lerobot==0.6.1 \\
        transformers==5.5.4 num2words
    python -m raytrain_vla.export RUN/checkpoint_... OUT/pretrained_model --format lerobot
    python benchmarks/lerobot_crosscheck.py OUT/pretrained_model --lerobot-python /tmp/lrv/bin/python

Both sides get the same batch (camera frames in [0, 1], state, task strings) and the same
noise; LeRobot runs `make_pre_post_processors(pretrained_path=...)` + `SmolVLAPolicy
.predict_action_chunk(batch, noise=...)` from inside the policy directory (where it resolves a
relative `vlm_model_name`). Prints JSON with the largest difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def lerobot_side(policy_dir: str, inputs: str, out: str) -> None:
    import torch
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    os.chdir(policy_dir)
    policy = SmolVLAPolicy.from_pretrained(policy_dir).eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=policy_dir)
    data = np.load(inputs, allow_pickle=False)
    batch = {key: torch.from_numpy(data[key]) for key in data.files if key not in ("noise", "task")}
    batch["task"] = [str(t) for t in data["task"]]
    with torch.no_grad():
        actions = policy.predict_action_chunk(pre(batch), noise=torch.from_numpy(data["noise"]))
    np.save(out, post(actions).numpy())


def our_side(policy_dir: str, lerobot_python: str, seed: int) -> dict:
    import torch

    from raytrain_vla import policy

    ours = policy.load(policy_dir)
    rng = np.random.default_rng(seed)
    size = 2
    batch: dict = {}
    for key, (c, h, w) in ours.camera_shapes.items():
        batch[key] = rng.integers(0, 256, (size, c, h, w)).astype(np.float32) / 255
    batch["observation.state"] = rng.normal(size=(size, ours.state_dim)).astype(np.float32)
    tasks = np.array(["pick up the red cube", "open the drawer"][:size])
    noise = rng.normal(size=(size, *ours.model.noise_shape)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        inputs, out = Path(tmp) / "inputs.npz", Path(tmp) / "lerobot.npy"
        np.savez(inputs, **batch, task=tasks, noise=noise)
        subprocess.run(
            [lerobot_python, __file__, policy_dir, "--side", "lerobot", "--inputs", str(inputs),
             "--out", str(out)],
            check=True,
        )  # fmt: skip
        theirs = np.load(out)
    torch_batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    torch_batch["task"] = [str(t) for t in tasks]
    mine = ours.predict_action_chunk(torch_batch, noise=torch.from_numpy(noise)).numpy()
    return {
        "policy": policy_dir,
        "shape": list(mine.shape),
        "max_abs_diff": float(np.abs(mine - theirs).max()),
        "max_abs_action": float(np.abs(theirs).max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("policy_dir")
    parser.add_argument("--side", choices=["ours", "lerobot"], default="ours")
    parser.add_argument("--lerobot-python", default="")
    parser.add_argument("--inputs", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    policy_dir = str(Path(args.policy_dir).resolve())
    if args.side == "lerobot":
        lerobot_side(policy_dir, args.inputs, args.out)
        return 0
    if not args.lerobot_python:
        parser.error("--lerobot-python: the python of an environment with lerobot 0.6.1")
    print(json.dumps(our_side(policy_dir, args.lerobot_python, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
