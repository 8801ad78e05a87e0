"""A tiny 2-D reaching simulator: the demo task's data source and its closed-loop evaluator.

Three coloured discs lie in the unit square; the instruction names one colour. The state is the
end-effector position, the action is a position delta. Solving it needs both vision (where is each
disc) and language (which colour was asked for), so a policy that ignores either fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (235, 220, 40),
}
TEMPLATES = ("reach the {} disc", "move to the {} target", "go to the {} one")
NUM_TARGETS = 3
TARGET_RADIUS = 0.07
AGENT_RADIUS = 0.045
MAX_STEP = 0.05  # largest position change per step, in world units
GAIN = 0.3  # the expert's proportional gain
SUCCESS_TOL = 0.03
MAX_EPISODE_STEPS = 40
FPS = 10
IMAGE_KEY = "observation.image"  # the camera's feature name in the demo dataset and policies
DEMO_ROBOT_TYPE = "sim_reach"  # `robot_type` in the demo dataset's meta/info.json


@dataclass
class Scene:
    targets: np.ndarray  # (NUM_TARGETS, 2) float32 positions in [0, 1]
    colors: list[str]  # colour name per target
    goal: int  # index of the named target
    instruction: str


def sample_scene(rng: np.random.Generator) -> tuple[Scene, np.ndarray]:
    """A random scene with well separated discs and a start position away from all of them."""
    colors = list(rng.choice(list(COLORS), size=NUM_TARGETS, replace=False))
    while True:
        pts = rng.uniform(0.12, 0.88, size=(NUM_TARGETS + 1, 2)).astype(np.float32)
        d = np.linalg.norm(pts[:, None] - pts[None], axis=-1) + np.eye(NUM_TARGETS + 1)
        if d.min() > 0.25:
            break
    goal = int(rng.integers(NUM_TARGETS))
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    scene = Scene(pts[:NUM_TARGETS], colors, goal, template.format(colors[goal]))
    return scene, pts[NUM_TARGETS]


def expert_action(scene: Scene, pos: np.ndarray) -> np.ndarray:
    """Proportional velocity toward the named disc, capped at MAX_STEP."""
    delta = GAIN * (scene.targets[scene.goal] - pos)
    norm = float(np.linalg.norm(delta))
    if norm > MAX_STEP:
        delta = delta * (MAX_STEP / norm)
    return delta.astype(np.float32)


def step(pos: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Apply a (clipped) action; the end effector stays in the unit square."""
    action = np.asarray(action, dtype=np.float32)
    norm = float(np.linalg.norm(action))
    if norm > 2 * MAX_STEP:
        action = action * (2 * MAX_STEP / norm)
    return np.clip(pos + action, 0.0, 1.0).astype(np.float32)


def goal_distance(scene: Scene, pos: np.ndarray) -> float:
    return float(np.linalg.norm(scene.targets[scene.goal] - pos))


_GRID_CACHE: dict[int, np.ndarray] = {}


def _pixel_centres(size: int) -> np.ndarray:
    if size not in _GRID_CACHE:
        c = (np.arange(size, dtype=np.float32) + 0.5) / size
        _GRID_CACHE[size] = np.stack(np.meshgrid(c, c, indexing="xy"), axis=-1)  # (H, W, 2) x,y
    return _GRID_CACHE[size]


def render(scene: Scene, pos: np.ndarray, size: int = 32) -> np.ndarray:
    """HWC uint8 image: dark background, coloured discs, a white end effector on top."""
    grid = _pixel_centres(size)
    img = np.full((size, size, 3), 20, dtype=np.uint8)
    for target, color in zip(scene.targets, scene.colors, strict=True):
        mask = np.linalg.norm(grid - target, axis=-1) <= TARGET_RADIUS
        img[mask] = COLORS[color]
    mask = np.linalg.norm(grid - pos, axis=-1) <= AGENT_RADIUS
    img[mask] = (255, 255, 255)
    return img


@dataclass
class Episode:
    scene: Scene
    images: np.ndarray  # (T, H, W, 3) uint8
    states: np.ndarray  # (T, 2) float32
    actions: np.ndarray  # (T, 2) float32


def rollout_expert(rng: np.random.Generator, image_size: int = 32) -> Episode:
    """One scripted-expert episode, ending at the first frame within SUCCESS_TOL of the goal."""
    scene, pos = sample_scene(rng)
    images, states, actions = [], [], []
    for _ in range(MAX_EPISODE_STEPS):
        action = expert_action(scene, pos)
        images.append(render(scene, pos, image_size))
        states.append(pos)
        actions.append(action)
        if goal_distance(scene, pos) < SUCCESS_TOL:
            break
        pos = step(pos, action)
    return Episode(scene, np.stack(images), np.stack(states), np.stack(actions))


class ReachEnv:
    """Closed-loop evaluation: observations in the dataset's format, success by goal distance."""

    def __init__(self, seed: int, image_size: int = 32, max_steps: int = MAX_EPISODE_STEPS):
        self.rng = np.random.default_rng(seed)
        self.image_size = image_size
        self.max_steps = max_steps

    def reset(self) -> dict:
        self.scene, self.pos = sample_scene(self.rng)
        self.t = 0
        return self.observation()

    def observation(self) -> dict:
        return {
            "image": render(self.scene, self.pos, self.image_size),
            "state": self.pos.copy(),
            "instruction": self.scene.instruction,
        }

    def step(self, action: np.ndarray) -> tuple[dict, bool, bool]:
        """Returns (observation, success, done)."""
        self.pos = step(self.pos, action)
        self.t += 1
        success = goal_distance(self.scene, self.pos) < SUCCESS_TOL
        done = success or self.t >= self.max_steps
        return self.observation(), success, done
