"""How well one camera can place Meta-World's goal, and what the first frame of an episode shows.
Prints JSON.

LeRobot's policies see one `corner2` frame and the hand's 4-D state, never the goal's xyz. For
reach and pick-place the goal floats anywhere in a 0.2 x 0.1 x 0.25 m box, so one pixel of the
frame is a ray through several goals. This resets each task `--resets` times (physics only),
projects every goal through the camera at `--image-size`, and reports:
- `share_a_pixel_far_apart`: goals whose pixel (within `--pixel-radius`) another goal shares
  while lying farther than the task's success radius away;
- `ceiling_from_the_pixel`: the success of a policy that knows the goal's pixel exactly and
  goes to the mean of the goals sharing it (the best guess from the frame alone);
- `reset_marker_stale`: resets whose goal marker is drawn away from the goal at the reset frame.
  Meta-World moves the marker's site after its last forward pass, so frame 0 of an episode (in
  LeRobot's env as here) shows the marker where it was before; it is right from step 1 on.
With `--dataset ROOT` (a `data metaworld` or `lerobot/metaworld_mt50` dataset) it also reports,
per task, the stored xyz actions' median and 99th-percentile magnitude and the share beyond
+-1 (what the env executes), beside the whole dataset's action std.

    MUJOCO_GL=egl python benchmarks/metaworld_goal_depth.py [--tasks reach,pick-place,push]
        [--dataset ROOT]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from raytrain_vla.common.metaworld_tasks import resolve_tasks
from raytrain_vla.sim import metaworld_env as mw

GOAL = slice(36, 39)  # the goal's xyz in Meta-World's 39-D observation
# Meta-World 3.1.1's success radii (`evaluate_state`): reach 0.05, push TARGET_RADIUS 0.05,
# pick-place 0.07.
SUCCESS_RADIUS = {"reach-v3": 0.05, "push-v3": 0.05, "pick-place-v3": 0.07}


def project(env, points: np.ndarray, image_size: int) -> np.ndarray:
    """(N, 3) world points -> (N, 2) pixel coordinates in the camera's (unflipped) frame."""
    camera = env.model.camera(mw.CAMERA).id
    origin = env.data.cam_xpos[camera]
    axes = env.data.cam_xmat[camera].reshape(3, 3)  # columns: the camera's x, y, z in the world
    focal = 0.5 * image_size / np.tan(np.deg2rad(env.model.cam_fovy[camera]) / 2)
    local = (points - origin) @ axes  # MuJoCo's cameras look down their -z
    return focal * local[:, :2] / -local[:, 2:3]


def analyse(task: str, resets: int, image_size: int, pixel_radius: float) -> dict[str, float]:
    env = mw.MetaWorldTask(task, image_size=None)
    marker = env.env.model.site("goal").id
    goals, stale = [], []
    for seed in range(resets):
        env.reset(seed)
        goal = env.environment_state[GOAL].astype(np.float64)
        goals.append(goal)
        stale.append(float(np.linalg.norm(env.env.data.site_xpos[marker] - goal)) > 1e-3)
    goals = np.asarray(goals)
    pixels = project(env.env, goals, image_size)
    env.close()
    radius = SUCCESS_RADIUS[task]
    same_pixel = ((pixels[:, None] - pixels[None]) ** 2).sum(-1) <= pixel_radius**2
    apart = np.linalg.norm(goals[:, None] - goals[None], axis=-1) > radius
    guesses = (same_pixel @ goals) / same_pixel.sum(1, keepdims=True)
    return {
        "success_radius_m": radius,
        "share_a_pixel_far_apart": round(float((same_pixel & apart).any(1).mean()), 3),
        "ceiling_from_the_pixel": round(
            float((np.linalg.norm(guesses - goals, axis=1) <= radius).mean()), 3
        ),
        "reset_marker_stale": round(float(np.mean(stale)), 3),
    }


def action_magnitudes(root: str) -> dict:
    """Per task: how large the stored xyz actions are against the +-1 the env executes."""
    from raytrain_vla.data.formats.lerobot import ACTION, LeRobotMeta, read_frames_table

    meta = LeRobotMeta.load(root)
    table = read_frames_table(meta, [ACTION, "task_index"])
    actions = np.stack(table[ACTION].to_numpy(zero_copy_only=False)).astype(np.float64)
    task_of = table["task_index"].to_numpy()
    per_task = {}
    for index, task in enumerate(meta.tasks):
        xyz = np.abs(actions[task_of == index, :3])
        if len(xyz):
            per_task[task] = {
                "frames": len(xyz),
                "median_abs": round(float(np.median(xyz)), 3),
                "p99_abs": round(float(np.quantile(xyz, 0.99)), 2),
                "beyond_1": round(float((xyz > 1).mean()), 3),
            }
    return {"action_std": actions.std(0).round(3).tolist(), "per_task": per_task}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="reach,pick-place,push")
    parser.add_argument("--resets", type=int, default=3000)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--pixel-radius", type=float, default=1.0)
    parser.add_argument("--dataset", default="", help="also report this dataset's actions")
    args = parser.parse_args()
    tasks = resolve_tasks(args.tasks)
    unknown = [t for t in tasks if t not in SUCCESS_RADIUS]
    if unknown:
        parser.error(f"no goal marker radius known for {', '.join(unknown)}; known: "
                     f"{', '.join(SUCCESS_RADIUS)}")  # fmt: skip
    report = {
        "image_size": args.image_size,
        "pixel_radius": args.pixel_radius,
        "resets": args.resets,
        "tasks": {t: analyse(t, args.resets, args.image_size, args.pixel_radius) for t in tasks},
    }
    if args.dataset:
        report["actions"] = action_magnitudes(args.dataset)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
