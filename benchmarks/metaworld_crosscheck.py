"""Our Meta-World env against LeRobot 0.6.1's own `MetaworldEnv`, side by side: the same tasks,
reset seeds `seed + k` (as `lerobot-eval` gives episode k), the same float32 actions; compares
every frame (480 px) and state, the step limit and the task tables. Prints JSON.

LeRobot needs Python >= 3.12, so its side runs in its own venv through a subprocess
(`--side lerobot`); that venv also needs `metaworld==3.1.1` (setup: `lerobot_crosscheck.py`).

    MUJOCO_GL=egl python benchmarks/metaworld_crosscheck.py --lerobot-python /tmp/lrv/bin/python
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

os.environ.setdefault("MUJOCO_GL", "egl")


def actions(steps: int, seed: int) -> np.ndarray:
    """Random float32 actions, some outside [-1, 1] (both sides must clip alike)."""
    return np.random.default_rng(seed).uniform(-1.2, 1.2, (steps, 4)).astype(np.float32)


def lerobot_side(tasks: list[str], episodes: int, seed: int, steps: int, out: Path) -> None:
    from lerobot.envs.metaworld import TASK_DESCRIPTIONS, TASK_NAME_TO_ID, MetaworldEnv

    arrays: dict[str, np.ndarray] = {}
    limits = {}
    for task in tasks:
        env = MetaworldEnv(task, obs_type="pixels_agent_pos")
        limits[task] = env._max_episode_steps
        for k in range(episodes):
            obs, _ = env.reset(seed=seed + k)
            frames, states = [obs["pixels"]], [obs["agent_pos"]]
            for action in actions(steps, seed + k):
                obs, _r, terminated, _t, _i = env.step(action)
                if terminated:  # LeRobot's env resets itself after a success
                    break
                frames.append(obs["pixels"])
                states.append(obs["agent_pos"])
            arrays[f"{task}/{k}/frames"] = np.stack(frames)
            arrays[f"{task}/{k}/states"] = np.stack(states).astype(np.float32)
        env.close()
    np.savez(out / "lerobot.npz", **arrays)
    tables = {"ids": TASK_NAME_TO_ID, "descriptions": TASK_DESCRIPTIONS, "limits": limits}
    (out / "lerobot.json").write_text(json.dumps(tables))


def our_side(tasks: list[str], episodes: int, seed: int, steps: int) -> dict[str, np.ndarray]:
    from raytrain_vla.sim import metaworld_env as mw

    arrays: dict[str, np.ndarray] = {}
    for task in tasks:
        env = mw.MetaWorldTask(task, image_size=mw.LEROBOT_IMAGE_SIZE)
        for k in range(episodes):
            step = env.reset(mw.reset_seed(seed, k))
            frames, states = [step.image], [step.state]
            for action in actions(steps, seed + k):
                step = env.step(action)
                if step.success:
                    break
                frames.append(step.image)
                states.append(step.state)
            arrays[f"{task}/{k}/frames"] = np.stack(frames)
            arrays[f"{task}/{k}/states"] = np.stack(states)
        env.close()
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=["ours", "lerobot"], default="ours")
    parser.add_argument("--lerobot-python", default="/tmp/lrv/bin/python")
    parser.add_argument("--tasks", default="reach-v3,pick-place-v3,window-close-v3")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None, help="(lerobot side) where to write its arrays")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    if args.side == "lerobot":
        lerobot_side(tasks, args.episodes, args.seed, args.steps, Path(args.out))
        return
    from raytrain_vla.common.metaworld_tasks import DESCRIPTIONS, MAX_PATH_LENGTH, TASK_INDEX

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            args.lerobot_python, __file__, "--side", "lerobot", "--tasks", args.tasks,
            "--episodes", str(args.episodes), "--seed", str(args.seed),
            "--steps", str(args.steps), "--out", tmp,
        ]  # fmt: skip
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": ""})
        theirs = dict(np.load(Path(tmp) / "lerobot.npz"))
        tables = json.loads((Path(tmp) / "lerobot.json").read_text())
    ours = our_side(tasks, args.episodes, args.seed, args.steps)
    frame_diff = max(
        int(np.abs(ours[k].astype(np.int16) - theirs[k].astype(np.int16)).max())
        for k in theirs
        if k.endswith("frames")
    )
    state_diff = max(float(np.abs(ours[k] - theirs[k]).max()) for k in theirs if "states" in k)
    lengths_equal = all(ours[k].shape == theirs[k].shape for k in theirs)
    result = {
        "tasks": tasks,
        "episodes_per_task": args.episodes,
        "reset_seeds": [args.seed + k for k in range(args.episodes)],
        "frames_compared": sum(len(v) for k, v in theirs.items() if k.endswith("frames")),
        "max_frame_diff": frame_diff,
        "max_state_diff": state_diff,
        "same_lengths": lengths_equal,
        "step_limit": {"ours": MAX_PATH_LENGTH, "lerobot": tables["limits"]},
        "task_ids_equal": tables["ids"] == TASK_INDEX,
        "descriptions_equal": tables["descriptions"] == DESCRIPTIONS,
    }
    print(json.dumps(result))
    sys.exit(0 if frame_diff == 0 and state_diff == 0 and lengths_equal else 1)


if __name__ == "__main__":
    main()
