"""Write Meta-World's scripted experts as a LeRobot v3.0 dataset (`raytrain-vla data metaworld`).

Each task's episodes are rolled out by one Ray task (one MuJoCo env per process). Episode k of a
task tries reset seeds `seed + attempt` for attempts 0, 1, ... (`lerobot-eval`'s scheme: keep the
range of a dataset's seeds apart from the evaluation's, default 1000 on) and keeps only
episodes the expert finishes successfully, so the same command writes the same dataset. The
expert's success rate per task is returned and written to `meta/metaworld.json`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raytrain_vla.common.atomic import refuse_non_empty
from raytrain_vla.common.metaworld_tasks import check_max_steps, resolve_tasks
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)
from raytrain_vla.sim import metaworld_env as mw

# h264 at crf 18: near-lossless for 32-128 px frames, and fast to encode and decode on CPU.
VIDEO = VideoSpec("libx264", 18, 2, "medium")
SIDECAR = "meta/metaworld.json"
log = logging.getLogger(__name__)


@dataclass
class TaskDemos:
    task: str
    episodes: list[EpisodeData]
    attempts: int
    seeds: list[int]  # the reset seed of each kept episode


def roll_out_task(
    task: str, episodes: int, image_size: int, seed: int, max_steps: int, max_attempts: int
) -> TaskDemos:
    """The expert's first `episodes` successes on `task` (at most `max_attempts` tries)."""
    env = mw.MetaWorldTask(task, image_size, max_steps)
    kept, seeds, attempt = [], [], 0
    try:
        while len(kept) < episodes and attempt < max_attempts:
            reset_seed = mw.reset_seed(seed, attempt)
            attempt += 1
            step = env.reset(reset_seed)
            images, states, actions = [], [], []
            while not step.done:
                action = env.expert_action()
                images.append(step.image)
                states.append(step.state)
                actions.append(np.clip(action, -1.0, 1.0))  # what the env executes
                step = env.step(action)
            if step.success:
                kept.append(
                    EpisodeData(
                        {mw.IMAGE_KEY: np.stack(images)}, np.stack(states), np.stack(actions),
                        env.instruction,
                    )
                )  # fmt: skip
                seeds.append(reset_seed)
    finally:
        env.close()
    return TaskDemos(task, kept, attempt, seeds)


def write_metaworld_dataset(
    root: str | os.PathLike,
    tasks: str,
    episodes_per_task: int,
    image_size: int = 128,
    seed: int = 0,
    max_steps: int = mw.MAX_STEPS,
) -> tuple[Path, dict[str, dict]]:
    """Roll out the experts of `tasks` (`resolve_tasks`' syntax) in parallel Ray tasks and write
    their successful episodes at `root`. Returns the root and, per task, the episodes kept, the
    attempts and the expert's success rate. Starts Ray if it is not running."""
    import ray

    from raytrain_vla.progress import progress

    root = Path(root)
    names = resolve_tasks(tasks)
    refuse_non_empty(root)
    mw.require_metaworld()
    check_max_steps(max_steps, "--max-steps")
    if episodes_per_task < 1 or image_size < 8:
        raise ValueError(
            "need episodes_per_task >= 1 and image_size >= 8; got "
            f"{episodes_per_task}, {image_size}"
        )
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=2)(roll_out_task)
    max_attempts = 3 * episodes_per_task + 5
    start = time.perf_counter()
    refs = {
        remote.remote(name, episodes_per_task, image_size, seed, max_steps, max_attempts): name
        for name in names
    }
    done: dict[str, TaskDemos] = {}
    pending = list(refs)
    for _ in progress(range(len(names)), f"Meta-World experts -> {root}", "task"):
        ready, pending = ray.wait(pending, num_returns=1)
        result = ray.get(ready[0])
        done[result.task] = result
    ordered = [done[name] for name in names]  # tasks in the order asked, whatever finished first
    report = {
        d.task: {
            "episodes": len(d.episodes),
            "attempts": d.attempts,
            "expert_success_rate": len(d.episodes) / d.attempts,
            "reset_seeds": d.seeds,
        }
        for d in ordered
    }
    short = [t for t, r in report.items() if r["episodes"] < episodes_per_task]
    if short:
        raise RuntimeError(
            f"the expert succeeded fewer than {episodes_per_task} times in {max_attempts} "
            f"attempts on {', '.join(short)}; nothing written to {root}"
        )
    episodes = [e for d in ordered for e in d.episodes]
    spec = DatasetSpec(
        mw.FPS, VIDEO, robot_type=mw.ROBOT_TYPE, state_names=mw.STATE_NAMES,
        action_names=mw.ACTION_NAMES,
    )  # fmt: skip
    write_lerobot_dataset(root, episodes, spec)
    sidecar = {
        "tasks": names,
        "episodes_per_task": episodes_per_task,
        "image_size": image_size,
        "seed": seed,
        "max_steps": max_steps,
        "per_task": report,
    }
    (root / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    log.info("Meta-World demos written in %.1f s", time.perf_counter() - start)
    return root, report
