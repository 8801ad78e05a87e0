"""Does a policy fit the demos it trained on, and those it did not see? Per task. Prints JSON.

The four MT10 tasks flow_vla fails in closed loop (reach, push, pick-place, peg-insert-side)
could fail for two opposite reasons, and they call for opposite levers:
- underfit: the chunks it predicts are as wrong on its own training episodes as on held-out
  ones, so longer training or a larger model is the lever;
- overfit: right on its training episodes, wrong on held-out scenes (a new goal or puck
  position), so more demos (more scenes) or stronger augmentation is the lever.

This predicts the action chunk at every `--stride`-th frame of every episode of `--dataset` (the
noise drawn from `--seed`, the same for every frame count), splits episodes as the trainer does
(`data.val_fraction`'s seeded choice, or `--val-episodes`), and reports per task and split
(and over all tasks, under "all"). `--unseen ROOT` adds a third split, "unseen": every episode
of a second dataset of fresh scenes (`data metaworld --seed` apart from the demos'), since the
trainer's 5% holds out only a few episodes a task:
- `mse_ratio`: the chunk's action MSE over the mean action's (the trainer's `val_mse_ratio`,
  with the mean of the training episodes' actions);
- `first_xyz_error`: the mean distance between the predicted and the expert's first xyz action
  (what the env executes, in its action units: 1 moves the hand 1 cm per step).

    python benchmarks/metaworld_fit.py POLICY_DIR --dataset ROOT [--action-clip=-1,1]
        [--unseen ROOT2] [--stride 4] [--val-fraction 0.05] [--val-episodes 3,17]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import torch

from raytrain_vla.data.dataset import split_episodes
from raytrain_vla.data.formats.episodes import read_episodes
from raytrain_vla.data.formats.lerobot import LeRobotMeta
from raytrain_vla.policy.runtime import Policy

XYZ = slice(0, 3)


def chunk_targets(actions: np.ndarray, frames: np.ndarray, chunk: int) -> tuple[np.ndarray, ...]:
    """(F, chunk, A) targets from each frame on, padded with the last action as the trainer
    pads, and (F, chunk) whether each position is a real action (padding is no target)."""
    offsets = frames[:, None] + np.arange(chunk)[None]
    valid = offsets < len(actions)
    return actions[np.minimum(offsets, len(actions) - 1)], valid


def episode_errors(
    policy: Policy, episode, stride: int, seed: int, clip: tuple[float, float] | None
) -> dict[str, np.ndarray]:
    """Squared chunk errors (F, chunk, A), validity (F, chunk), first-action xyz distances (F,)."""
    actions = episode.action.astype(np.float32)
    if clip:
        actions = np.clip(actions, *clip)
    frames = np.arange(0, len(actions), stride)
    chunk, action_dim = policy.model.noise_shape
    target, valid = chunk_targets(actions, frames, chunk)
    (camera,) = policy.camera_keys
    predicted = []
    for start in range(0, len(frames), 64):
        rows = frames[start : start + 64]
        noise = torch.randn(
            (len(rows), chunk, action_dim), generator=torch.Generator().manual_seed(seed + start)
        )
        observation = {
            camera: torch.as_tensor(episode.cameras[camera][rows]),
            "observation.state": torch.as_tensor(episode.state[rows], dtype=torch.float32),
            "task": [episode.task] * len(rows),
        }
        predicted.append(policy.predict_action_chunk(observation, noise=noise).cpu().numpy())
    pred = np.concatenate(predicted)
    return {
        "pred": pred,
        "target": target,
        "valid": valid,
        "first_xyz": np.linalg.norm(pred[:, 0, XYZ] - target[:, 0, XYZ], axis=-1),
    }


def summarise(parts: list[dict[str, np.ndarray]], mean_action: np.ndarray) -> dict[str, float]:
    valid = np.concatenate([p["valid"] for p in parts])[..., None]
    pred = np.concatenate([p["pred"] for p in parts])
    target = np.concatenate([p["target"] for p in parts])
    mse = ((pred - target) ** 2 * valid).sum() / valid.sum()
    base = ((mean_action - target) ** 2 * valid).sum() / valid.sum()
    return {
        "episodes": len(parts),
        "frames": int(len(pred)),
        "mse_ratio": round(float(mse / base), 4),
        "first_xyz_error": round(float(np.concatenate([p["first_xyz"] for p in parts]).mean()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="an exported policy directory")
    parser.add_argument("--dataset", required=True, help="the LeRobot dataset it trained on")
    parser.add_argument("--unseen", default="", help="a dataset of scenes it never saw")
    parser.add_argument(
        "--action-clip", default="", help="LOW,HIGH (write --action-clip=-1,1): as data.action_clip"
    )
    parser.add_argument("--stride", type=int, default=4, help="score every n-th frame")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--val-episodes", default="", help="comma-separated held-out episodes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.stride < 1:
        parser.error(f"--stride {args.stride}: expected a positive integer")
    clip = tuple(float(v) for v in args.action_clip.split(",")) if args.action_clip else None
    if clip is not None and (len(clip) != 2 or clip[0] >= clip[1]):
        parser.error(f"--action-clip {args.action_clip!r}: expected LOW,HIGH with LOW < HIGH")
    val_episodes = [int(v) for v in args.val_episodes.split(",") if v]

    torch.set_num_threads(2)
    policy = Policy.from_pretrained(args.policy)
    meta = LeRobotMeta.load(args.dataset)
    held_out = set(split_episodes(meta.num_episodes, args.val_fraction, val_episodes).tolist())
    parts: dict[tuple[str, str], list] = defaultdict(list)
    train_actions = []
    for index, episode in enumerate(read_episodes(args.dataset)):
        split = "held_out" if index in held_out else "train"
        parts[(episode.task, split)].append(
            episode_errors(policy, episode, args.stride, args.seed, clip)
        )
        if split == "train":
            actions = episode.action.astype(np.float32)
            train_actions.append(np.clip(actions, *clip) if clip else actions)
    if args.unseen:
        for episode in read_episodes(args.unseen):
            parts[(episode.task, "unseen")].append(
                episode_errors(policy, episode, args.stride, args.seed, clip)
            )
    mean_action = np.concatenate(train_actions).mean(0)
    report: dict[str, dict] = defaultdict(dict)
    for (task, split), task_parts in sorted(parts.items()):
        report[task][split] = summarise(task_parts, mean_action)
    for split in ("train", "held_out", "unseen"):
        every = [p for (_, s), task_parts in parts.items() if s == split for p in task_parts]
        if every:
            report["all"][split] = summarise(every, mean_action)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
