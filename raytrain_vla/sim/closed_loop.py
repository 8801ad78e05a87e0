"""Closed-loop evaluation on the demo task: step a policy from reset to done, score success.

Success means ending within `sim.SUCCESS_TOL` of the disc the instruction names. Two baselines
bound what the numbers mean: uniformly random actions, and the same policy with the
instruction blanked (it sees the scene but not which disc to reach).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raytrain_vla.progress import progress
from raytrain_vla.sim import simulator as sim
from raytrain_vla.sim.simulator import DEMO_ROBOT_TYPE, IMAGE_KEY

Controller = Callable[[dict], np.ndarray]


@dataclass
class Rollout:
    """One recorded episode: what the camera saw, for a table, a strip or an animation."""

    instruction: str
    success: bool
    final_distance: float
    frames: np.ndarray  # (T + 1, H, W, 3) uint8, the reset frame first


@dataclass
class EvalResult:
    name: str
    episodes: int
    success_rate: float
    mean_final_distance: float
    mean_steps: float
    rollouts: list[Rollout] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "rollouts"}


def is_demo_dataset(root: str | Path) -> bool:
    """Closed-loop scores mean something only on the data the simulator itself wrote."""
    info = Path(root) / "meta" / "info.json"
    try:
        return json.loads(info.read_text()).get("robot_type") == DEMO_ROBOT_TYPE
    except (OSError, ValueError):
        return False


def frame_strip(frames: np.ndarray, max_frames: int = 10) -> np.ndarray:
    """Evenly spaced frames side by side (always the first and the last), separated by a gap."""
    picks = np.unique(np.linspace(0, len(frames) - 1, min(max_frames, len(frames))).round())
    h, _, c = frames.shape[1:]
    gap = np.full((h, 2, c), 255, dtype=np.uint8)
    parts = [p for i in picks.astype(int) for p in (frames[i], gap)][:-1]
    return np.concatenate(parts, axis=1)


def run_episodes(
    name: str,
    act: Controller,
    reset: Callable[[], None],
    episodes: int,
    seed: int,
    image_size: int,
    record: int = 0,
) -> EvalResult:
    """The same `seed` gives every controller the same scenes, so rates compare pairwise.

    The first `record` episodes keep their frames."""
    env = sim.ReachEnv(seed, image_size)
    successes, distances, steps, rollouts = 0, [], [], []
    for episode in progress(range(episodes), f"closed loop: {name}", "ep"):
        obs, done, success = env.reset(), False, False
        frames = [obs["image"]] if episode < record else None
        reset()
        while not done:
            policy_obs = {
                IMAGE_KEY: obs["image"],
                "observation.state": obs["state"],
                "task": obs["instruction"],
            }
            obs, success, done = env.step(np.asarray(act(policy_obs), dtype=np.float32))
            if frames is not None:
                frames.append(obs["image"])
        successes += success
        distances.append(sim.goal_distance(env.scene, env.pos))
        steps.append(env.t)
        if frames is not None:
            rollouts.append(
                Rollout(env.scene.instruction, bool(success), distances[-1], np.stack(frames))
            )
    return EvalResult(
        name, episodes, successes / episodes, float(np.mean(distances)), float(np.mean(steps)),
        rollouts,
    )  # fmt: skip


def render_size(policy) -> int:
    """The camera resolution the policy was trained from: the simulator renders at it and the
    policy's processor resizes, as for the demo dataset's frames."""
    return int(policy.camera_shapes[IMAGE_KEY][1])


def evaluate(
    policy, episodes: int, seed: int = 0, image_size: int | None = None, record: int = 0
) -> list[EvalResult]:
    """The policy, the random baseline and the instruction-blind policy on the same scenes;
    the policy's first `record` episodes keep their frames. `image_size` defaults to the
    policy's `render_size`."""
    image_size = image_size or render_size(policy)
    rng = np.random.default_rng(seed)
    action_dim = policy.action_dim

    def random_action(_obs: dict) -> np.ndarray:
        return rng.uniform(-sim.MAX_STEP, sim.MAX_STEP, size=action_dim)

    def blind(obs: dict) -> np.ndarray:
        return policy.select_action({**obs, "task": ""})

    return [
        run_episodes(
            "policy", policy.select_action, policy.reset, episodes, seed, image_size, record
        ),
        run_episodes("random", random_action, lambda: None, episodes, seed, image_size),
        run_episodes("instruction_blind", blind, policy.reset, episodes, seed, image_size),
    ]
