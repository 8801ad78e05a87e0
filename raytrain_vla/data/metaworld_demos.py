"""Write Meta-World's scripted experts as a LeRobot v3.0 dataset (`raytrain-vla data metaworld`).

Each task's episodes are rolled out by one Ray task (one MuJoCo env per process), which streams
its kept episodes back one at a time; the driver writes them to disk as they arrive, task by task
in the order asked, so it never holds more than an episode (MT50 x 50 at 128 px was 12 GB when
the driver held the dataset). Episode k of a task tries reset seeds `seed + attempt` for attempts
0, 1, ... (`lerobot-eval`'s scheme: keep the range of a dataset's seeds apart from the
evaluation's, default 1000 on) and keeps only episodes the expert finishes successfully, so the
same command writes the same dataset. The expert's success rate per task is returned and written
to `meta/metaworld.json`.

Two layouts:
- `ours` (default): one mp4 camera, LeRobot's Meta-World names for state and action, actions
  clipped to [-1, 1] as the env executes them; small and fast to decode.
- `lerobot`: `lerobot/metaworld_mt50`'s own layout: PNG frames in the data files (480 px by
  default), robot `metaworld`, `observation.environment_state` (Meta-World's 39-D observation),
  `next.reward`, `next.success`, `task_id` (LeRobot's task ids) and the expert's actions
  unclipped, as that dataset stores them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raytrain_vla.common.atomic import refuse_non_empty
from raytrain_vla.common.metaworld_tasks import TASK_INDEX, check_max_steps, resolve_tasks
from raytrain_vla.data.formats.writer import DatasetSpec, DatasetWriter, EpisodeData, VideoSpec
from raytrain_vla.sim import metaworld_env as mw

# h264 at crf 18: near-lossless for 32-128 px frames, and fast to encode and decode on CPU.
VIDEO = VideoSpec("libx264", 18, 2, "medium")
SIDECAR = "meta/metaworld.json"
LAYOUTS = ("ours", "lerobot")
DEFAULT_IMAGE_SIZE = {"ours": 128, "lerobot": mw.LEROBOT_IMAGE_SIZE}
ENVIRONMENT_STATE = "observation.environment_state"
log = logging.getLogger(__name__)


@dataclass
class TaskDemos:
    """What a task's roll-out did, after its episodes: attempts and each kept episode's seed."""

    task: str
    episodes: int
    attempts: int
    seeds: list[int]  # the reset seed of each kept episode


def dataset_spec(layout: str) -> DatasetSpec:
    if layout == "lerobot":  # lerobot/metaworld_mt50's info.json
        names = {
            "observation.state": {"axes": None},
            "action": {"axes": ["x", "y", "z", "gripper"]},
            ENVIRONMENT_STATE: ["keypoints"],
        }
        return DatasetSpec(
            mw.FPS, robot_type="metaworld", images="png", channels_first=True, names=names
        )
    return DatasetSpec(
        mw.FPS, VIDEO, robot_type=mw.ROBOT_TYPE, state_names=mw.STATE_NAMES,
        action_names=mw.ACTION_NAMES,
    )  # fmt: skip


def roll_out_task(
    task: str,
    episodes: int,
    image_size: int,
    seed: int,
    max_steps: int,
    max_attempts: int,
    layout: str = "ours",
) -> Iterator[EpisodeData | TaskDemos]:
    """The expert's first `episodes` successes on `task` (at most `max_attempts` tries), one
    `EpisodeData` at a time, then the `TaskDemos` summary."""
    env = mw.MetaWorldTask(task, image_size, max_steps)
    kept, seeds, attempt = 0, [], 0
    try:
        while kept < episodes and attempt < max_attempts:
            reset_seed = mw.reset_seed(seed, attempt)
            attempt += 1
            step = env.reset(reset_seed)
            images, states, actions, env_states, rewards, successes = [], [], [], [], [], []
            while not step.done:
                action = env.expert_action()
                images.append(step.image)
                states.append(step.state)
                env_states.append(env.environment_state)
                actions.append(action if layout == "lerobot" else np.clip(action, -1.0, 1.0))
                step = env.step(action)
                rewards.append(step.reward)
                successes.append(step.success)
            if not step.success:
                continue
            kept += 1
            seeds.append(reset_seed)
            extra = {}
            if layout == "lerobot":
                t = len(states)
                extra = {
                    "next.reward": np.asarray(rewards, np.float32),
                    "next.success": np.asarray(successes, bool),
                    ENVIRONMENT_STATE: np.stack(env_states),
                    "task_id": np.full(t, TASK_INDEX[task], np.int16),
                }
            yield EpisodeData(
                {mw.IMAGE_KEY: np.stack(images)}, np.stack(states), np.stack(actions),
                env.instruction, extra,
            )  # fmt: skip
    finally:
        env.close()
    yield TaskDemos(task, kept, attempt, seeds)


def write_metaworld_dataset(
    root: str | os.PathLike,
    tasks: str,
    episodes_per_task: int,
    image_size: int | None = None,
    seed: int = 0,
    max_steps: int = mw.MAX_STEPS,
    layout: str = "ours",
) -> tuple[Path, dict[str, dict]]:
    """Roll out the experts of `tasks` (`resolve_tasks`' syntax) in parallel Ray tasks and write
    their successful episodes at `root` in `layout` (`image_size` None: the layout's default).
    Returns the root and, per task, the episodes kept, the attempts and the expert's success
    rate. Starts Ray if it is not running."""
    import ray

    from raytrain_vla.progress import progress

    root = Path(root)
    names = resolve_tasks(tasks)
    refuse_non_empty(root)
    if layout not in LAYOUTS:
        raise ValueError(
            f"bad value for --layout: {layout!r}, expected one of {', '.join(LAYOUTS)}"
        )
    image_size = DEFAULT_IMAGE_SIZE[layout] if image_size is None else image_size
    mw.require_metaworld()
    check_max_steps(max_steps, "--max-steps")
    if episodes_per_task < 1 or image_size < 8:
        raise ValueError(
            "need episodes_per_task >= 1 and image_size >= 8; got "
            f"{episodes_per_task}, {image_size}"
        )
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=2, num_returns="streaming")(roll_out_task)
    max_attempts = 3 * episodes_per_task + 5
    start = time.perf_counter()
    streams = [
        remote.remote(name, episodes_per_task, image_size, seed, max_steps, max_attempts, layout)
        for name in names
    ]  # all tasks run at once; their episodes wait in the object store until written
    done: list[TaskDemos] = []
    with DatasetWriter(root, dataset_spec(layout)) as writer:
        for stream in progress(streams, f"Meta-World experts -> {root}", "task"):
            for ref in stream:
                item = ray.get(ref)
                if isinstance(item, TaskDemos):
                    done.append(item)
                else:
                    writer.add(item)
                del item, ref
        report = {
            d.task: {
                "episodes": d.episodes,
                "attempts": d.attempts,
                "expert_success_rate": d.episodes / d.attempts,
                "reset_seeds": d.seeds,
            }
            for d in done
        }
        short = [t for t, r in report.items() if r["episodes"] < episodes_per_task]
        if short:  # raised inside the writer: nothing is left at root
            raise RuntimeError(
                f"the expert succeeded fewer than {episodes_per_task} times in {max_attempts} "
                f"attempts on {', '.join(short)}; nothing written to {root}"
            )
        sidecar = {
            "tasks": names,
            "episodes_per_task": episodes_per_task,
            "image_size": image_size,
            "seed": seed,
            "max_steps": max_steps,
            "layout": layout,
            "per_task": report,
        }
        (writer.tmp / SIDECAR).parent.mkdir(parents=True, exist_ok=True)
        (writer.tmp / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    log.info("Meta-World demos written in %.1f s", time.perf_counter() - start)
    return root, report
