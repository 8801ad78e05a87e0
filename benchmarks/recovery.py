"""Time from a worker SIGKILL to the next completed training step, median over several runs.

Each run trains the tiny model with 2 workers on a small demo dataset, checkpoints every 10
steps, and SIGKILLs rank 1 right after step 35 (`debug.kill_at_step`). The kill time is the
fault marker's timestamp; the recovery point is the first step completed after it (from
`metrics.jsonl`, one record per step). Prints JSON.

    python benchmarks/recovery.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import ray

from raytrain_vla import run
from raytrain_vla.data.demo import write_demo_dataset

SAVE_INTERVAL = 10
KILL_AFTER_STEP = 35  # between the step-30 and step-40 checkpoints


def one_run(data: Path, storage: Path, name: str, kill_step: int) -> dict:
    args = [
        f"--data.root={data}",
        "--data.val_fraction=0.1",
        "--data.val_max_samples=32",
        "--train.steps=50",
        "--train.global_batch_size=16",
        "--train.micro_batch_size=8",
        "--train.log_interval=1",
        "--train.val_interval=1000",
        f"--train.save_interval={SAVE_INTERVAL}",
        f"--ray.storage_path={storage}",
        f"--ray.run_name={name}",
        "--ray.max_failures=1",
        "--logging.wandb_mode=disabled",
        "--eval.episodes=0",
        "--logging.console=false",
        f"--debug.kill_at_step={kill_step}",
        "--debug.kill_rank=1",
    ]
    if run.main(args) != 0:
        raise RuntimeError(f"run {name} failed")
    run_dir = storage / name
    killed_at = float((run_dir / f".fault_kill_{kill_step}").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = sorted((r for r in rows if r["kind"] == "train"), key=lambda r: r["time"])
    # Rank 0 logs every step once per attempt: the first step number that does not increase
    # marks the restarted attempt, whose first completed step is the recovery point.
    highest, restart = -1, None
    for i, row in enumerate(rows):
        if row["step"] <= highest:
            restart = i
            break
        highest = row["step"]
    if restart is None:
        raise RuntimeError(f"{run_dir}: no restarted attempt found in metrics.jsonl")
    # Ray registers a checkpoint only after polling every rank, so the restart may begin before
    # the newest save; "caught up" is when the redone steps pass the step of the kill again.
    caught_up = next(r for r in rows[restart:] if r["step"] > kill_step)
    return {
        "kill_to_next_step_s": round(rows[restart]["time"] - killed_at, 2),
        "kill_to_caught_up_s": round(caught_up["time"] - killed_at, 2),
        "resumed_from_step": rows[restart]["step"] - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_demo_dataset(Path(tmp) / "demo", num_episodes=60, seed=0)
        ray.init(num_cpus=8, include_dashboard=True, log_to_driver=False)
        results = [
            one_run(data, Path(tmp) / "runs", f"kill{i}", KILL_AFTER_STEP) for i in range(args.runs)
        ]
        ray.shutdown()
    times = [r["kill_to_next_step_s"] for r in results]
    print(
        json.dumps(
            {
                "runs": results,
                "median_kill_to_next_step_s": round(statistics.median(times), 2),
                "median_kill_to_caught_up_s": round(
                    statistics.median(r["kill_to_caught_up_s"] for r in results), 2
                ),
                "checkpoint_interval_steps": SAVE_INTERVAL,
                "kill_after_step": KILL_AFTER_STEP,
                "note": "includes Ray Train detecting the dead worker, restarting the group, DCP load, "
                "data pipeline start and redoing the steps after the last checkpoint",
            }
        )
    )


if __name__ == "__main__":
    main()
