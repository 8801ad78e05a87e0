"""One Meta-World task as LeRobot 0.6.1's Meta-World env presents it, and its scripted expert.

LeRobot's conventions (`lerobot/envs/metaworld.py`, `lerobot_eval.py`), so that data written
and scored here match `lerobot/metaworld_mt50` and `lerobot-eval --env.type=metaworld`:
- the task comes from `MT1(task, seed=42)`'s first train task, and `reset(seed)` draws object and
  goal positions from the seed (`seeded_rand_vec`); `lerobot-eval` resets episode k of every
  task with `seed + k` (`reset_seed`);
- one camera, `corner2` moved to (0.75, 0.075, 0.7), its image flipped on both axes, rendered
  with the model's own lighting and 4096 px shadow map (LeRobot renders 480 x 480; at that size
  the frames here are LeRobot's, byte for byte);
- `observation.state` is the first 4 entries of Meta-World's observation (hand xyz, gripper);
- actions are 4-D and reach Meta-World as given (it clips xyz to [-1, 1], MuJoCo the gripper);
- an episode ends at success or after 500 steps: LeRobot's env sets `_max_episode_steps = 500`
  (Meta-World's `max_path_length`), which `lerobot-eval` runs to; its config's
  `episode_length=400` never reaches the env.

Rendering is the cost (physics is ~0.5 ms a step, a frame 40-90 ms on CPU). It is paid only for
frames somebody looks at: a controller that does not look (random, expert) renders nothing, and
a policy renders only the steps at which it replans (`metaworld_eval`), which changes nothing it
sees.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from raytrain_vla.common.metaworld_tasks import DESCRIPTIONS, MAX_PATH_LENGTH

os.environ.setdefault("MUJOCO_GL", "egl")  # headless; must precede the first mujoco import

IMAGE_KEY = "observation.image"  # LeRobot's key for Meta-World's one camera
STATE_KEY = "observation.state"
FPS = 80  # LeRobot's MetaworldEnv config
MAX_STEPS = MAX_PATH_LENGTH  # LeRobot's MetaworldEnv `_max_episode_steps`, what lerobot-eval runs
LEROBOT_IMAGE_SIZE = 480  # LeRobot's MetaworldEnv frame (Meta-World's default render size)
STATE_NAMES = ["hand_x", "hand_y", "hand_z", "gripper"]
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
ROBOT_TYPE = "sawyer"
CAMERA = "corner2"
CAMERA_POS = (0.75, 0.075, 0.7)
MISSING = "Meta-World is not installed: pip install 'raytrain_vla[metaworld]'"


def require_metaworld() -> None:
    """An ImportError with the install line, before any work starts."""
    import importlib.util

    if importlib.util.find_spec("metaworld") is None:
        raise ImportError(MISSING)


@dataclass
class Step:
    image: np.ndarray | None  # (H, W, 3) uint8, None when the env does not render
    state: np.ndarray  # (4,) float32
    success: bool
    done: bool  # success, or the step limit reached
    reward: float = 0.0  # Meta-World's reward for the step that led here (0 at reset)


class MetaWorldTask:
    """One task's env, reset by seed. It renders when `image_size` is set and `rendering` is
    true (controllers that do not look, random and expert, skip the render cost)."""

    def __init__(self, task: str, image_size: int | None = 128, max_steps: int = MAX_STEPS):
        if task not in DESCRIPTIONS:
            raise ValueError(f"unknown Meta-World task {task!r}")
        require_metaworld()
        import metaworld
        import metaworld.policies

        self.task = task
        self.instruction = DESCRIPTIONS[task]
        self.max_steps = max_steps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            benchmark = metaworld.MT1(task, seed=42)
            env = benchmark.train_classes[task]()
            env.set_task(benchmark.train_tasks[0])
        env.model.cam_pos[env.model.camera(CAMERA).id] = CAMERA_POS
        env.reset()
        env._freeze_rand_vec = False  # as LeRobot: positions drawn anew at each reset ...
        env.seeded_rand_vec = True  # ... from the seed given to reset
        self.env = env
        self.expert = metaworld.policies.ENV_POLICY_MAP[task]()
        self.renderer = None
        self.rendering = bool(image_size)
        if image_size:
            import mujoco

            self.renderer = mujoco.Renderer(env.model, image_size, image_size)
        self._raw = np.zeros(39)
        self.t = 0

    def render(self) -> np.ndarray | None:
        if self.renderer is None or not self.rendering:
            return None
        self.renderer.update_scene(self.env.data, camera=CAMERA)
        return np.ascontiguousarray(np.flip(self.renderer.render(), (0, 1)))  # corner2 is flipped

    @property
    def environment_state(self) -> np.ndarray:
        """Meta-World's whole 39-D observation (hand, gripper, objects, goal), as float32:
        LeRobot's `observation.environment_state`."""
        return self._raw.astype(np.float32)

    def _step(self, success: bool, reward: float = 0.0) -> Step:
        state = self._raw[:4].astype(np.float32)
        done = success or self.t >= self.max_steps
        return Step(self.render(), state, success, done, reward)

    def reset(self, seed: int) -> Step:
        self.env.seed(seed)
        self._raw, _ = self.env.reset(seed=seed)
        self.t = 0
        return self._step(False)

    def step(self, action: np.ndarray) -> Step:
        """One env step with the action as given, as LeRobot's env steps it (a float32 action
        stays float32: Meta-World's arithmetic, and so the next state, follows its dtype)."""
        self._raw, reward, _terminated, truncated, info = self.env.step(action)
        self.t += 1
        step = self._step(bool(info.get("success", 0)), float(reward))
        step.done = step.done or bool(truncated)
        return step

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the current state, unclipped as LeRobot's
        `metaworld_mt50` stores it (the env clips what it executes)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Constant(s) may be too high": the env clips
            action = self.expert.get_action(self._raw)
        return np.asarray(action, dtype=np.float32)

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None
        self.env.close()


def reset_seed(seed: int, episode: int) -> int:
    """The reset seed of episode `episode` of any task: `lerobot-eval`'s `seed + k`."""
    return seed + episode
