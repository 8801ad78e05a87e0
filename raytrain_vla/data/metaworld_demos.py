"""Write Meta-World's scripted experts as a LeRobot v3.0 dataset (`raytrain-vla data metaworld`).

Each task's episodes are rolled out by one Ray task (one MuJoCo env per process), which streams
its kept episodes back one at a time; the driver writes them to disk as they arrive, task by task
in the order asked, so it never holds more than an episode (MT50 x 50 at 128 px was 12 GB when
the driver held the dataset). Episode k of a task tries reset seeds `seed + attempt` for attempts
0, 1, ... (`lerobot-eval`'s scheme: keep the range of a dataset's seeds apart from the
evaluation's, default 1000 on) and keeps only episodes the expert finishes successfully (found
without rendering, then replayed with frames), so the same command writes the same dataset. The
expert's success rate per task is returned and written to `meta/metaworld.json`.

A dataset can grow (`--base`): a new one holds the base's episodes first, copied episode for
episode (`formats.episodes`), then its own, with one normalisation over both. With `--policy`
(DAgger) a trained policy drives instead of the expert, the expert labels every state it
reaches, and every episode is kept (cut at `--policy-max-steps`, if given: a failing policy's
500 rendered steps cost 7 expert episodes, and its first steps are where it drifts): the states
a policy drifts into, labelled, are what imitation of the expert's own episodes never shows it
(Ross et al. 2011).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raytrain_vla.common.atomic import refuse_non_empty
from raytrain_vla.common.metaworld_tasks import TASK_INDEX, check_max_steps, resolve_tasks
from raytrain_vla.data.formats.episodes import read_episodes
from raytrain_vla.data.formats.writer import DatasetSpec, DatasetWriter, EpisodeData, VideoSpec
from raytrain_vla.sim import metaworld_env as mw
from raytrain_vla.sim.metaworld_eval import policy_controller

# h264 at crf 18: near-lossless for 32-128 px frames, and fast to encode and decode on CPU.
VIDEO = VideoSpec("libx264", 18, 2, "medium")
SIDECAR = "meta/metaworld.json"
LAYOUTS = ("ours", "lerobot")
DEFAULT_IMAGE_SIZE = {"ours": 128, "lerobot": mw.LEROBOT_IMAGE_SIZE}
ENVIRONMENT_STATE = "observation.environment_state"
log = logging.getLogger(__name__)


@dataclass
class TaskDemos:
    """What a task's roll-out did, after its episodes: attempts, each kept episode's seed and,
    when a policy drove, how many of its episodes it finished successfully."""

    task: str
    episodes: int
    attempts: int
    seeds: list[int]  # the reset seed of each kept episode
    successes: int = 0


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
    make_policy: Callable[[], object] | None = None,
) -> Iterator[EpisodeData | TaskDemos]:
    """The expert's first `episodes` successes on `task` (at most `max_attempts` tries), one
    `EpisodeData` at a time, then the `TaskDemos` summary.

    With `make_policy` (DAgger), the policy drives and the expert only labels: each recorded
    action is the expert's at the state the policy reached, and every episode is kept, whether
    the policy finished it or not (its failures are where the labels matter most)."""
    env = mw.MetaWorldTask(task, image_size, max_steps)
    policy = None
    if make_policy is not None:
        import torch

        torch.set_num_threads(1)  # one roll-out per CPU
        policy = make_policy()
    kept, seeds, attempt, successes = 0, [], 0, 0
    try:
        while kept < episodes and attempt < max_attempts:
            reset_seed = mw.reset_seed(seed, attempt)
            attempt += 1
            if policy is None and not expert_succeeds(env, reset_seed):
                continue  # found without a frame: a failure's 500 renders would be thrown away
            step = env.reset(reset_seed)
            drive = policy_controller(policy, env) if policy is not None else None
            images, states, actions, env_states, rewards, dones = [], [], [], [], [], []
            while not step.done:
                label = env.expert_action()
                images.append(step.image)
                states.append(step.state)
                env_states.append(env.environment_state)
                actions.append(label if layout == "lerobot" else np.clip(label, -1.0, 1.0))
                step = env.step(label if drive is None else drive(step))
                rewards.append(step.reward)
                dones.append(step.success)
            successes += step.success
            if not step.success and policy is None:
                raise RuntimeError(
                    f"{task}: the expert succeeded from reset seed {reset_seed} without frames "
                    "but not with them; the env is not deterministic"
                )
            kept += 1
            seeds.append(reset_seed)
            extra = {}
            if layout == "lerobot":
                t = len(states)
                extra = {
                    "next.reward": np.asarray(rewards, np.float32),
                    "next.success": np.asarray(dones, bool),
                    ENVIRONMENT_STATE: np.stack(env_states),
                    "task_id": np.full(t, TASK_INDEX[task], np.int16),
                }
            yield EpisodeData(
                {mw.IMAGE_KEY: np.stack(images)}, np.stack(states), np.stack(actions),
                env.instruction, extra,
            )  # fmt: skip
    finally:
        env.close()
    yield TaskDemos(task, kept, attempt, seeds, successes)


def expert_succeeds(env: mw.MetaWorldTask, reset_seed: int) -> bool:
    """Whether the expert finishes the episode from `reset_seed`, found by physics alone (a
    step costs ~0.3 ms, a frame ~65 ms): the env and the expert are deterministic, so the
    rendered replay of a success is the same episode."""
    rendering, env.rendering = env.rendering, False
    try:
        step = env.reset(reset_seed)
        while not step.done:
            step = env.step(env.expert_action())
        return step.success
    finally:
        env.rendering = rendering


@dataclass(frozen=True)
class OnPolicy:
    """DAgger's driver: the exported policy that drives, replanning every `n_action_steps`
    (None: its own setting), built in each roll-out by `make_policy` (the caller loads and
    checks it: data sits below the policy room)."""

    policy_dir: str
    n_action_steps: int | None
    make_policy: Callable[[], object] = field(repr=False, compare=False)
    max_steps: int | None = None  # cut each episode here (None: the dataset's step limit)


def base_settings(base: Path) -> dict:
    """The sidecar of a dataset `data metaworld` wrote, which `--base` extends."""
    sidecar = base / SIDECAR
    try:
        return json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"--base {base}: no {SIDECAR}; only a dataset `data metaworld` wrote can be extended"
        ) from None


def _resolve(given, base: dict | None, key: str, default):
    """A setting the user gave, else the base dataset's, else the default; a given value that
    differs from the base's is refused (one dataset has one layout, frame size, step limit)."""
    if base is None:
        return default if given is None else given
    if given is not None and given != base[key]:
        raise ValueError(f"--{key.replace('_', '-')} {given} differs from --base's {base[key]}")
    return base[key]


def _expert_seeds(base: dict, task: str) -> list[int]:
    """The reset seeds of `task`'s expert episodes in a base and the bases it extends."""
    seeds: list[int] = []
    while base:
        if base.get("policy") is None:
            seeds += base["per_task"].get(task, {}).get("reset_seeds", [])
        base = base.get("base")
    return seeds


def _check_seeds(base: dict, names: list[str], seed: int, max_attempts: int) -> None:
    """Expert episodes appended to a base must not replay its expert's scenes."""
    for task in names:
        used = _expert_seeds(base, task)
        if any(seed <= s < seed + max_attempts for s in used):
            raise ValueError(
                f"--seed {seed}: the expert would replay --base's scenes of {task} (its reset "
                f"seeds reach {max(used)}); pick --seed {max(used) + 1} or above"
            )


def write_metaworld_dataset(
    root: str | os.PathLike,
    tasks: str,
    episodes_per_task: int,
    image_size: int | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    layout: str | None = None,
    base: str | os.PathLike | None = None,
    on_policy: OnPolicy | None = None,
) -> tuple[Path, dict[str, dict]]:
    """Roll out `tasks` (`resolve_tasks`' syntax) in parallel Ray tasks and write their episodes
    at `root` in `layout`: the expert's successful episodes, or with `on_policy` (DAgger) every
    episode the policy drives, labelled by the expert. `base` (a dataset this function wrote)
    comes first, episode for episode, and fixes layout, frame size and step limit (None: the
    base's, else "ours", its default size, 500). Returns the root and, per task, the episodes
    kept, the attempts and the expert's (or the policy's) success rate. Starts Ray if needed."""
    import ray

    from raytrain_vla.progress import progress

    root = Path(root)
    names = resolve_tasks(tasks)
    refuse_non_empty(root)
    prior = base_settings(Path(base)) if base is not None else None
    layout = _resolve(layout, prior, "layout", "ours")
    if layout not in LAYOUTS:
        raise ValueError(
            f"bad value for --layout: {layout!r}, expected one of {', '.join(LAYOUTS)}"
        )
    image_size = _resolve(image_size, prior, "image_size", DEFAULT_IMAGE_SIZE[layout])
    max_steps = _resolve(max_steps, prior, "max_steps", mw.MAX_STEPS)
    mw.require_metaworld()
    check_max_steps(max_steps, "--max-steps")
    if episodes_per_task < 1 or image_size < 8:
        raise ValueError(
            "need episodes_per_task >= 1 and image_size >= 8; got "
            f"{episodes_per_task}, {image_size}"
        )
    max_attempts = episodes_per_task if on_policy else 3 * episodes_per_task + 5
    make_policy = on_policy.make_policy if on_policy is not None else None
    roll_out_steps = max_steps
    if on_policy is not None and on_policy.max_steps is not None:
        if on_policy.max_steps > max_steps:
            raise ValueError(
                f"--policy-max-steps {on_policy.max_steps} exceeds the dataset's step limit "
                f"{max_steps}"
            )
        roll_out_steps = on_policy.max_steps
    if on_policy is None and prior is not None:
        _check_seeds(prior, names, seed, max_attempts)
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=2, num_returns="streaming")(roll_out_task)
    start = time.perf_counter()
    streams = [
        remote.remote(
            name,
            episodes_per_task,
            image_size,
            seed,
            roll_out_steps,
            max_attempts,
            layout,
            make_policy,
        )  # fmt: skip
        for name in names
    ]  # all tasks run at once; their episodes wait in the object store until written
    done: list[TaskDemos] = []
    with DatasetWriter(root, dataset_spec(layout)) as writer:
        if base is not None:
            for episode in read_episodes(base):
                writer.add(episode)
        for stream in progress(streams, f"Meta-World roll-outs -> {root}", "task"):
            for ref in stream:
                item = ray.get(ref)
                if isinstance(item, TaskDemos):
                    done.append(item)
                else:
                    writer.add(item)
                del item, ref
        report = {d.task: _task_report(d, on_policy is not None) for d in done}
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
            "policy": None
            if on_policy is None
            else {
                "policy_dir": on_policy.policy_dir,
                "n_action_steps": on_policy.n_action_steps,
                "max_steps": roll_out_steps,
            },
            "base": None if base is None else {"root": str(base), **prior},
        }
        (writer.tmp / SIDECAR).parent.mkdir(parents=True, exist_ok=True)
        (writer.tmp / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    log.info("Meta-World episodes written in %.1f s", time.perf_counter() - start)
    return root, report


def _task_report(demos: TaskDemos, on_policy: bool) -> dict:
    rate = demos.successes / demos.attempts if demos.attempts else 0.0
    return {
        "episodes": demos.episodes,
        "attempts": demos.attempts,
        "policy_success_rate" if on_policy else "expert_success_rate": rate,
        "reset_seeds": demos.seeds,
    }
