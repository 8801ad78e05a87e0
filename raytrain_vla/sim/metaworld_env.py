"""One Meta-World task as LeRobot's Meta-World env presents it, and its scripted expert.

LeRobot's conventions (`lerobot/envs/metaworld.py`), so that data written and scored here match
`lerobot/metaworld_mt50` and `lerobot-eval --env.type=metaworld`:
- the task comes from `MT1(task, seed=42)`'s first train task, and `reset(seed)` draws object and
  goal positions from the seed (`seeded_rand_vec`);
- one camera, `corner2` moved to (0.75, 0.075, 0.7), its image flipped on both axes;
- `observation.state` is the first 4 entries of Meta-World's observation (hand xyz, gripper);
- actions are 4-D in [-1, 1] (end-effector delta, gripper); an episode ends at success.

Rendering is the cost (physics is ~0.5 ms a step). The shadow map is 1024 px instead of
MuJoCo's 4096: a 128 px frame cannot show the difference, and it halves the render time on
CPU (Mesa's llvmpipe).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from raytrain_vla.common.metaworld_tasks import DESCRIPTIONS

os.environ.setdefault("MUJOCO_GL", "egl")  # headless; must precede the first mujoco import

IMAGE_KEY = "observation.image"  # LeRobot's key for Meta-World's one camera
STATE_KEY = "observation.state"
FPS = 80  # LeRobot's MetaworldEnv config
MAX_STEPS = 400  # LeRobot's MetaworldEnv `episode_length`
STATE_NAMES = ["hand_x", "hand_y", "hand_z", "gripper"]
ACTION_NAMES = ["dx", "dy", "dz", "gripper"]
ROBOT_TYPE = "sawyer"
CAMERA = "corner2"
CAMERA_POS = (0.75, 0.075, 0.7)
SHADOW_MAP = 1024
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
        env.model.vis.quality.shadowsize = SHADOW_MAP
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

    def _step(self, success: bool) -> Step:
        state = self._raw[:4].astype(np.float32)
        done = success or self.t >= self.max_steps
        return Step(self.render(), state, success, done)

    def reset(self, seed: int) -> Step:
        self.env.seed(seed)
        self._raw, _ = self.env.reset(seed=seed)
        self.t = 0
        return self._step(False)

    def step(self, action: np.ndarray) -> Step:
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self._raw, _reward, _terminated, truncated, info = self.env.step(action)
        self.t += 1
        step = self._step(bool(info.get("success", 0)))
        step.done = step.done or bool(truncated)
        return step

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action for the current state, clipped as the env clips it."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Constant(s) may be too high": the env clips
            action = self.expert.get_action(self._raw)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
            self.renderer = None
        self.env.close()


def episode_seed(seed: int, task: str, episode: int) -> int:
    """The reset seed of one episode: the same for the same (seed, task, episode) anywhere."""
    from raytrain_vla.common.metaworld_tasks import TASK_INDEX

    state = np.random.SeedSequence([seed, TASK_INDEX[task], episode]).generate_state(1)
    return int(state[0] & 0x7FFFFFFF)
