"""How the sample plan and the per-task reads scale with the dataset (no media, no Ray).

A synthetic LeRobot v3.0 index (episodes of 100-300 frames, 500 episodes per data file, 100 per
video file, two cameras, 1,000 tasks) is opened the way training opens it (`LeRobotSource` over
the metadata, `SamplePlan.from_runs` over the training episodes, 5% held out as by default). For the last of `--ranks`
ranks it measures:

- plan build: `from_runs` plus the first global step's rank slice (the per-epoch block pass);
- memory per rank: tracemalloc peak and what stays held after the first read task is built,
  for the plan and for the source index;
- bytes per read task: the pickled `{read, epochs}` item Ray Data ships for one task of
  `--samples-per-task` samples;
- time to the first read task fresh (step 0) and after resuming at 90% of epoch 3 (median of
  `--repeats`, each with a new plan, so the per-epoch block pass is inside the timing).

With `--mixture N` (default 4), the same frames split into N datasets (weights 1/1, 1/2, ...)
also form a `MixturePlan`: its bytes per rank, the time per step of one rank's work next to the
single plan's, and the first step fresh and after the same resume (counts before it in closed
form).

`before` rows compute what the previous design held (a per-frame id permutation, episode array
and span list per rank; every low-dimensional column pickled into every task) from the same
sizes, so the ratio is side by side. Prints JSON.

    python benchmarks/plan_scale.py --frames 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
import tracemalloc

import numpy as np

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.dataset import split_episodes
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.mixture_plan import MixturePlan
from raytrain_vla.data.plan import SamplePlan
from raytrain_vla.data.read_tasks import rank_read_tasks
from raytrain_vla.data.synthetic_index import ACTION_DIM, CAMERAS, STATE_DIM, synthetic_meta


def before_bytes(frames: int, episodes: int, world: int, global_batch: int) -> dict:
    """What the previous design held per rank, and pickled into each read task, at this size."""
    spans = frames // 16
    plan = frames * 8 * 3 + spans * 112  # sample ids, episode of each, P_e; a list of span arrays
    work = frames // world * 8 * 2 * 3  # 3 epochs of ids and epochs, built up front
    per_frame = (STATE_DIM + ACTION_DIM) * 4 + 8 * 3 + len(CAMERAS) * 16  # columns + video refs
    return {
        "plan_bytes_per_rank": plan + work,
        "bytes_per_read_task": frames * per_frame,
        "global_batch": global_batch,
    }


def first_task(plan: SamplePlan, source: LeRobotSource, step: int, rank: int, world: int,
               samples_per_task: int, micro: int) -> tuple[dict, int]:  # fmt: skip
    """The rank's first read task from `step`, cut as training cuts it (`rank_read_tasks`)."""
    end = step + 10 * plan.steps_per_epoch
    ids, epochs = next(rank_read_tasks(plan, step, end, rank, world, samples_per_task, micro))
    item = {"read": source.reader(ids), "epochs": epochs}
    return item, len(pickle.dumps(item))


def _per_step_s(plan, step: int, rank: int, world: int, steps: int = 100) -> float:
    t0 = time.perf_counter()
    for _ in plan.iter_rank_work(step, step + steps, rank, world):
        pass
    return (time.perf_counter() - t0) / steps


def training_runs(length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first id, length) of the training episodes of a dataset with these episode lengths,
    held out as training holds them out by default (`data.val_fraction`)."""
    length = np.asarray(length, np.int64)
    first = np.cumsum(length) - length
    held_out = split_episodes(len(length), DataConfig().val_fraction, [])
    train = np.ones(len(length), bool)
    train[held_out] = False
    return first[train], length[train]


def measure_mixture(length, args, resume_step: int) -> dict:
    """The frames' episodes dealt into `--mixture` datasets (each with its own ids and held-out
    episodes, as each dataset of a mixture has), weighted 1/1, 1/2, ..."""
    n, rank, world, g = args.mixture, args.ranks - 1, args.ranks, args.global_batch
    parts = [training_runs(length[d::n]) for d in range(n)]
    single = SamplePlan.from_runs(*training_runs(length), seed=0, global_batch_size=g)

    def build() -> MixturePlan:
        plans = [SamplePlan.from_runs(f, ln, 0, 1) for f, ln in parts]
        offsets = np.cumsum([0] + [int(ln.sum()) for _, ln in parts[:-1]])  # disjoint ids
        return MixturePlan(plans, offsets.tolist(), [1 / (d + 1) for d in range(n)], 0, g)

    timings: dict[str, list[float]] = {"fresh": [], "resume": []}
    for _ in range(args.repeats):
        for name, step in (("fresh", 0), ("resume", resume_step)):
            t0 = time.perf_counter()
            next(build().iter_rank_work(step, step + 1, rank, world))
            timings[name].append(time.perf_counter() - t0)
    mix = build()
    mixture_step, single_step = (
        _per_step_s(mix, resume_step, rank, world),
        _per_step_s(single, resume_step, rank, world),
    )
    median = {k: statistics.median(v) for k, v in timings.items()}
    return {
        "datasets": n,
        "plan_bytes_per_rank": mix.nbytes,
        "rank_work_s_per_step": round(mixture_step, 5),
        "single_plan_rank_work_s_per_step": round(single_step, 5),
        "per_step_mixture_over_single": mixture_step / single_step,
        "first_step_s": {k: round(v, 4) for k, v in median.items()},
        "resume_over_fresh": median["resume"] / median["fresh"],
    }


def measure(frames: int, args) -> dict:
    episodes = max(1, round(frames * args.episodes_per_frame))
    meta = synthetic_meta(frames, episodes)
    rank, world, g = args.ranks - 1, args.ranks, args.global_batch
    first, length = training_runs(meta.episode_length)
    t0 = time.perf_counter()
    source = LeRobotSource(meta, chunk_size=50, checked_files=False)
    t_source = time.perf_counter() - t0
    timings: dict[str, list[float]] = {"fresh": [], "resume_90pct_epoch3": []}
    builds = []
    for _ in range(args.repeats):  # timed without tracemalloc, which slows allocation
        for name, times in timings.items():
            t0 = time.perf_counter()
            plan = SamplePlan.from_runs(first, length, seed=0, global_batch_size=g)
            builds.append(time.perf_counter() - t0)
            step = 0 if name == "fresh" else int(3.9 * plan.steps_per_epoch)
            first_task(plan, source, step, rank, world, args.samples_per_task, args.micro)
            times.append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in timings.items()}
    build = statistics.median(builds)
    tracemalloc.start()
    source = LeRobotSource(meta, chunk_size=50, checked_files=False)
    source_held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    plan = SamplePlan.from_runs(first, length, seed=0, global_batch_size=g)
    item, nbytes = first_task(plan, source, 0, rank, world, args.samples_per_task, args.micro)
    held = tracemalloc.get_traced_memory()[0] - base
    peak = tracemalloc.get_traced_memory()[1] - base
    plan_nbytes = plan.nbytes
    tracemalloc.stop()
    before = before_bytes(frames, episodes, world, g)
    resume_step = int(3.9 * plan.steps_per_epoch)
    mixture = measure_mixture(meta.episode_length, args, resume_step) if args.mixture > 1 else None
    return {
        "frames": frames,
        "episodes": episodes,
        "ranks": world,
        "source_open_s": round(t_source, 3),
        "source_index_bytes": source_held,
        "plan_build_s": round(build, 4),
        "plan_bytes_per_rank": plan_nbytes,
        "rank_held_bytes_after_first_task": held,
        "rank_peak_bytes": peak,
        "frames_over_world_x8_bytes": frames // world * 8,
        "bytes_per_read_task": nbytes,
        "first_task_s": {k: round(v, 4) for k, v in median.items()},
        "resume_over_fresh": median["resume_90pct_epoch3"] / median["fresh"],
        "before": before,
        "ratios": {
            "plan_bytes_before_over_now": before["plan_bytes_per_rank"] / plan_nbytes,
            "task_bytes_before_over_now": before["bytes_per_read_task"] / nbytes,
        },
        **({"mixture": mixture} if mixture else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--episodes-per-frame", type=float, default=50_000 / 10_000_000)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--samples-per-task", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mixture", type=int, default=4, help="datasets in the mixture rows")
    args = parser.parse_args()
    rows = [measure(n, args) for n in args.frames]
    out = {"rows": rows}
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        out["growth_first_to_last"] = {
            "frames": b["frames"] / a["frames"],
            "plan_bytes_per_rank": b["plan_bytes_per_rank"] / a["plan_bytes_per_rank"],
            "bytes_per_read_task": b["bytes_per_read_task"] / a["bytes_per_read_task"],
        }
    out["targets_met"] = {
        "plan_bytes_per_rank<=frames/world*8": all(
            r["plan_bytes_per_rank"] <= r["frames_over_world_x8_bytes"] for r in rows
        ),
        "resume_over_fresh<=1.2": all(r["resume_over_fresh"] <= 1.2 for r in rows),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
