"""A small dataset laid out like a real arm's (SO-100 style), written by the project's writer:
two cameras of different resolutions, 6-DoF state and action, instructions of 60-120
characters, episodes of uneven length. Shared by the unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)

CAMERAS = {"observation.images.top": (480, 640), "observation.images.wrist": (240, 320)}
JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
COLOURS = ["red", "green", "blue", "yellow"]
PLACES = ["the left bin", "the white plate next to the robot base", "the small tray"]


def instruction(i: int) -> str:
    text = (
        f"pick up the {COLOURS[i % 4]} cube from the table, lift it slowly and place it in "
        f"{PLACES[i % 3]}"
    )
    assert 60 <= len(text) <= 120, len(text)
    return text


def _frames(rng: np.random.Generator, length: int, hw: tuple[int, int], path: np.ndarray):
    """A bright square that follows the first two joints over a dim textured background."""
    h, w = hw
    base = rng.integers(20, 60, (h, w, 3), dtype=np.uint8)
    frames = np.repeat(base[None], length, axis=0)
    size = max(4, h // 10)
    for t in range(length):
        y = int((path[t, 0] + 1) / 2 * (h - size))
        x = int((path[t, 1] + 1) / 2 * (w - size))
        frames[t, y : y + size, x : x + size] = (230, 200, 40)
    return frames


def write_arm_dataset(
    root: Path,
    lengths: tuple[int, ...] = (40, 25, 6, 33, 18, 29),
    cameras: dict[str, tuple[int, int]] | None = None,
    seed: int = 0,
    fps: int = 30,
) -> Path:
    rng = np.random.default_rng(seed)
    episodes = []
    for i, length in enumerate(lengths):
        t = np.linspace(0, 1, length, dtype=np.float32)[:, None]
        phase = rng.uniform(0, 2 * np.pi, 6).astype(np.float32)
        state = np.sin(2 * np.pi * t * 0.7 + phase).astype(np.float32) * 0.8
        action = np.roll(state, -1, axis=0)
        action[-1] = state[-1]
        frames = {key: _frames(rng, length, hw, state) for key, hw in (cameras or CAMERAS).items()}
        episodes.append(EpisodeData(frames, state, action, instruction(i)))
    spec = DatasetSpec(
        fps,
        VideoSpec("libx264", 23, 30, "ultrafast"),
        robot_type="so100_follower",
        state_names=[f"{j}.pos" for j in JOINTS],
        action_names=[f"{j}.pos" for j in JOINTS],
    )
    return write_lerobot_dataset(root, episodes, spec)
