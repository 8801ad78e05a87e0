"""Meta-World is scored as `lerobot-eval` scores it: LeRobot 0.6.1's frames, its 500-step limit
and its reset seeds `seed + k`. LeRobot's env is rebuilt here from Meta-World itself, line for
line as `lerobot/envs/metaworld.py` builds it (`_ensure_env`, `render`, `step`), since LeRobot
lives in its own venv (`benchmarks/metaworld_crosscheck.py` runs LeRobot's own class). Needs
MuJoCo (the dev extra), no Ray; a few seconds, most of it the 480 px renders."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from raytrain_vla.sim import metaworld_env as mw
from raytrain_vla.sim.metaworld_eval import EpisodeRunner

TASK = "push-v3"


class LeRobotMetaworldEnv:
    """LeRobot 0.6.1's `MetaworldEnv` for `camera_name="corner2"`, reduced to its env calls."""

    def __init__(self, task: str):
        import metaworld

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mt1 = metaworld.MT1(task, seed=42)
            env = mt1.train_classes[task](render_mode="rgb_array", camera_name="corner2")
            env.set_task(mt1.train_tasks[0])
        env.model.cam_pos[2] = [0.75, 0.075, 0.7]
        env.reset()
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        self.env = env
        self._max_episode_steps = 500

    def render(self) -> np.ndarray:
        return np.flip(self.env.render(), (0, 1))

    def reset(self, seed: int) -> np.ndarray:
        self.env.seed(seed)
        raw, _ = self.env.reset(seed=seed)
        return raw

    def step(self, action: np.ndarray):
        return self.env.step(action)


@pytest.fixture(scope="module")
def lerobot_env():
    env = LeRobotMetaworldEnv(TASK)
    yield env
    env.env.close()


def test_frames_states_and_steps_are_lerobots(lerobot_env):
    """Same seed, same float32 actions (some outside [-1, 1]): LeRobot's 480 px frame (shadow
    map, camera position, flip) and state, to the bit, at reset and after every step."""
    ours = mw.MetaWorldTask(TASK, image_size=mw.LEROBOT_IMAGE_SIZE)
    try:
        raw = lerobot_env.reset(1003)
        step = ours.reset(1003)
        np.testing.assert_array_equal(step.state, raw[:4].astype(np.float32))
        np.testing.assert_array_equal(step.image, lerobot_env.render())
        actions = np.random.default_rng(0).uniform(-1.3, 1.3, (4, 4)).astype(np.float32)
        for action in actions:
            raw, *_ = lerobot_env.step(action)
            step = ours.step(action)
            np.testing.assert_array_equal(ours._raw, raw)
            np.testing.assert_array_equal(step.image, lerobot_env.render())
    finally:
        ours.close()


def test_an_episode_runs_to_lerobots_500_steps(lerobot_env):
    assert mw.MAX_STEPS == lerobot_env._max_episode_steps == lerobot_env.env.max_path_length
    env = mw.MetaWorldTask("reach-v3", image_size=None)
    try:
        step = env.reset(1000)
        while not step.done:
            step = env.step(np.zeros(4, np.float32))  # the hand stays: never a success
        assert env.t == 500 and not step.success
    finally:
        env.close()


def test_episode_k_of_every_task_resets_with_seed_plus_k(lerobot_env):
    runner = EpisodeRunner(None, image_size=16, max_steps=3)
    try:
        for task in (TASK, "reach-v3"):
            episode = runner.run("expert", task, 4, 1000, record=False)
            assert episode.reset_seed == mw.reset_seed(1000, 4) == 1004
        env = runner.envs[TASK]
        env.reset(1004)  # the scene (object and goal positions are in the raw observation)
        np.testing.assert_array_equal(env._raw, lerobot_env.reset(1004))
        scene = env._raw.copy()
        env.reset(1005)
        assert not np.array_equal(scene, env._raw)
    finally:
        runner.close()


class ReplanningPolicy:
    """A policy that replans every 3 steps and keeps the frames it was shown then."""

    camera_keys = [mw.IMAGE_KEY]

    def __init__(self):
        self.seen: list[np.ndarray] = []
        self._left = 0

    def reset(self) -> None:
        self.seen, self._left = [], 0

    @property
    def needs_observation(self) -> bool:
        return self._left == 0

    def select_action(self, obs: dict) -> np.ndarray:
        if self._left == 0:
            self.seen.append(obs[mw.IMAGE_KEY].copy())
            self._left = 3
        self._left -= 1
        return np.array([0.5, -0.5, 0.2, 1.0], np.float32)


def test_a_policy_is_rendered_only_the_frames_it_reads_and_they_are_the_same():
    policy = ReplanningPolicy()
    runner = EpisodeRunner(lambda: policy, image_size=24, max_steps=10)
    try:
        env = runner._env("reach-v3")
        renders, renderer = [], env.renderer
        real_render = renderer.render
        renderer.render = lambda *a, **k: renders.append(1) or real_render(*a, **k)
        lazy = runner.run("policy", "reach-v3", 0, 1000, record=False)
        seen = list(policy.seen)
        assert lazy.steps == 10 and len(seen) == 4  # replans at steps 0, 3, 6, 9
        assert sum(renders) == len(seen)  # and one render each, none between
        every = runner.run("policy", "reach-v3", 0, 1000, record=True)  # renders every step
        assert every.frames is not None and len(every.frames) == 11
        for k, frame in zip((0, 3, 6, 9), seen, strict=True):
            np.testing.assert_array_equal(frame, every.frames[k])
    finally:
        runner.close()
