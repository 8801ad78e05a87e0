"""Closed-loop evaluation on the demo task: step a policy from reset to done, score success.

Success means ending within `sim.SUCCESS_TOL` of the disc the instruction names. Two baselines
bound what the numbers mean: uniformly random actions, and the same policy with the
instruction blanked (it sees the scene but not which disc to reach).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from raytrain_vla.data import sim
from raytrain_vla.data.demo import IMAGE_KEY

Controller = Callable[[dict], np.ndarray]


@dataclass
class EvalResult:
    name: str
    episodes: int
    success_rate: float
    mean_final_distance: float
    mean_steps: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def run_episodes(
    name: str,
    act: Controller,
    reset: Callable[[], None],
    episodes: int,
    seed: int,
    image_size: int,
) -> EvalResult:
    """The same `seed` gives every controller the same scenes, so rates compare pairwise."""
    env = sim.ReachEnv(seed, image_size)
    successes, distances, steps = 0, [], []
    for _ in range(episodes):
        obs, done, success = env.reset(), False, False
        reset()
        while not done:
            policy_obs = {
                IMAGE_KEY: obs["image"],
                "state": obs["state"],
                "instruction": obs["instruction"],
            }
            obs, success, done = env.step(np.asarray(act(policy_obs), dtype=np.float32))
        successes += success
        distances.append(sim.goal_distance(env.scene, env.pos))
        steps.append(env.t)
    return EvalResult(
        name, episodes, successes / episodes, float(np.mean(distances)), float(np.mean(steps))
    )


def evaluate(policy, episodes: int, seed: int = 0, image_size: int = 32) -> list[EvalResult]:
    """The policy, the random baseline and the instruction-blind policy on the same scenes."""
    rng = np.random.default_rng(seed)
    action_dim = policy.kwargs["action_dim"]

    def random_action(_obs: dict) -> np.ndarray:
        return rng.uniform(-sim.MAX_STEP, sim.MAX_STEP, size=action_dim)

    def blind(obs: dict) -> np.ndarray:
        return policy.select_action({**obs, "instruction": ""})

    return [
        run_episodes("policy", policy.select_action, policy.reset, episodes, seed, image_size),
        run_episodes("random", random_action, lambda: None, episodes, seed, image_size),
        run_episodes("instruction_blind", blind, policy.reset, episodes, seed, image_size),
    ]
