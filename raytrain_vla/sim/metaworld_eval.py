"""Closed-loop success on Meta-World tasks: a policy, random actions and the scripted expert,
episodes spread over Ray actors (one MuJoCo env per task in each actor).

The protocol is `lerobot-eval`'s: episode k of every task resets with `seed + k` for every
controller, and success is Meta-World's own `info["success"]` within `max_steps` steps (500,
LeRobot's `_max_episode_steps`). The policy restarts its noise stream at every episode, so a
result depends on the policy and the seed alone, not on how many actors ran it or in which
order. A policy's frame is rendered only at the steps where it replans (`needs_observation`):
the others' frames are never read, by LeRobot's policies either. Rates are means over a task's
episodes; a group's and the overall rate are means over tasks, as published MT50 tables
average them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from raytrain_vla.common.metaworld_tasks import GROUPS, group_of
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.sim import metaworld_env as mw

CONTROLLERS = ("policy", "random", "expert")
PolicyFactory = Callable[[], object]  # builds the policy inside each actor


@dataclass
class Episode:
    controller: str
    task: str
    episode: int
    reset_seed: int
    success: bool
    steps: int
    frames: np.ndarray | None = field(default=None, repr=False)


@dataclass
class ControllerScore:
    """One controller's success per task, per difficulty group and overall."""

    name: str
    per_task: dict[str, float]
    episodes_per_task: int

    @property
    def success_rate(self) -> float:
        return float(np.mean(list(self.per_task.values())))

    @property
    def by_group(self) -> dict[str, float]:
        groups: dict[str, list[float]] = {}
        for task, rate in self.per_task.items():
            groups.setdefault(group_of(task), []).append(rate)
        return {g: float(np.mean(groups[g])) for g in GROUPS if g in groups}

    def to_dict(self) -> dict:
        return {
            "success_rate": self.success_rate,
            "by_group": self.by_group,
            "per_task": self.per_task,
            "episodes_per_task": self.episodes_per_task,
        }


class EpisodeRunner:
    """A Ray actor's work: episodes of any task with any controller, envs built on first use."""

    def __init__(self, make_policy: PolicyFactory | None, image_size: int, max_steps: int):
        import torch

        torch.set_num_threads(1)  # one actor per CPU
        self.policy = make_policy() if make_policy is not None else None
        self.image_size = image_size
        self.max_steps = max_steps
        self.envs: dict[str, mw.MetaWorldTask] = {}

    def _env(self, task: str) -> mw.MetaWorldTask:
        if task not in self.envs:
            self.envs[task] = mw.MetaWorldTask(task, self.image_size, self.max_steps)
        return self.envs[task]

    def run(self, controller: str, task: str, episode: int, seed: int, record: bool) -> Episode:
        env = self._env(task)
        looks = controller == "policy"
        env.rendering = looks or record
        reset_seed = mw.reset_seed(seed, episode)
        step = env.reset(reset_seed)
        act = self._controller(controller, env, reset_seed)
        frames = [step.image] if record else None
        while not step.done:
            action = act(step)
            env.rendering = record or (looks and self.policy.needs_observation)
            step = env.step(action)
            if frames is not None:
                frames.append(step.image)
        return Episode(
            controller, task, episode, reset_seed, step.success, env.t,
            np.stack(frames) if frames is not None else None,
        )  # fmt: skip

    def _controller(self, name: str, env: mw.MetaWorldTask, reset_seed: int):
        if name == "expert":
            return lambda _step: env.expert_action()
        if name == "random":
            rng = np.random.default_rng(reset_seed)
            return lambda _step: rng.uniform(-1.0, 1.0, size=4)
        if self.policy is None:
            raise ValueError("no policy given to score")
        return policy_controller(self.policy, env)

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


def policy_controller(policy, env: mw.MetaWorldTask) -> Callable[[mw.Step], np.ndarray]:
    """The policy as a controller of `env` for one episode (its queue and noise reset here):
    the env's frame, state and instruction in, a float32 action out, as LeRobot's."""
    policy.reset()
    (camera,) = policy.camera_keys

    def act(step: mw.Step) -> np.ndarray:
        obs = {camera: step.image, mw.STATE_KEY: step.state, "task": env.instruction}
        return np.asarray(policy.select_action(obs), dtype=np.float32)

    return act


def policy_image_size(spec: DataSpec) -> int:
    """Render at the resolution the policy was trained from (its processor resizes anyway);
    a ValueError when its data cannot be Meta-World's (one camera, 4-D state and actions)."""
    if len(spec.camera_keys) != 1:
        raise ValueError(
            f"Meta-World has one camera; this policy reads {len(spec.camera_keys)} "
            f"({', '.join(spec.camera_keys)})"
        )
    (camera,) = spec.camera_keys
    if spec.state_dim != 4 or spec.action_dim != 4:
        raise ValueError(
            f"Meta-World's state and action are 4-D; this policy's are {spec.state_dim}-D and "
            f"{spec.action_dim}-D"
        )
    return int(spec.camera_shapes[camera][1])


def evaluate_metaworld(
    make_policy: PolicyFactory | None,
    tasks: list[str],
    episodes: int,
    seed: int,
    image_size: int,
    controllers: tuple[str, ...] = CONTROLLERS,
    max_steps: int = mw.MAX_STEPS,
    record: int = 0,
    workers: int = 2,
    num_cpus: float = 1,
) -> tuple[dict[str, ControllerScore], list[Episode]]:
    """Every controller's scores, and the policy's first `record` episodes of each task with
    their frames. `num_cpus` per actor: 0 inside a training run, whose workers idle meanwhile."""
    import ray
    from ray.util.actor_pool import ActorPool

    from raytrain_vla.progress import progress

    jobs = [
        (c, t, k, c == "policy" and k < record)
        for c in controllers
        for t in tasks
        for k in range(episodes)
    ]
    actor = ray.remote(num_cpus=num_cpus)(EpisodeRunner)
    factory = make_policy if "policy" in controllers else None
    runners = [
        actor.remote(factory, image_size, max_steps) for _ in range(max(1, min(workers, len(jobs))))
    ]
    pool = ActorPool(runners)
    results = pool.map_unordered(
        lambda runner, job: runner.run.remote(job[0], job[1], job[2], seed, job[3]), jobs
    )
    done = list(progress(results, "Meta-World episodes", "ep", total=len(jobs)))
    for runner in runners:
        ray.kill(runner)
    scores = {}
    for name in controllers:
        per_task = {
            t: float(np.mean([e.success for e in done if e.controller == name and e.task == t]))
            for t in tasks
        }
        scores[name] = ControllerScore(name, per_task, episodes)
    recorded = sorted(
        (e for e in done if e.frames is not None), key=lambda e: (tasks.index(e.task), e.episode)
    )
    return scores, recorded


def scores_json(scores: dict[str, ControllerScore], **context) -> str:
    """One JSON line: the run's context, then each controller's scores under its name."""
    clash = set(context) & set(scores)
    if clash:
        raise ValueError(f"context keys {sorted(clash)} would hide controllers' scores")
    return json.dumps({**context, **{n: s.to_dict() for n, s in scores.items()}})
