"""CLI overrides for a short tiny-model run with 2 workers, shared by the integration tests."""

from __future__ import annotations

from pathlib import Path


def short_run_args(data_root: Path, storage: Path, name: str, steps: int, *extra: str) -> list[str]:
    """Global batch 16 (micro 8), a checkpoint every 3 steps, constant LR, one log line per step,
    no wandb and no closed-loop episodes."""
    return [
        f"--data.root={data_root}",
        "--data.val_fraction=0.1",
        "--data.val_max_samples=64",
        f"--train.steps={steps}",
        "--train.global_batch_size=16",
        "--train.micro_batch_size=8",
        "--train.log_interval=1",
        "--train.val_interval=1000",
        "--train.save_interval=3",
        "--scheduler.type=constant",
        "--scheduler.warmup_steps=2",
        f"--ray.storage_path={storage}",
        f"--ray.run_name={name}",
        "--logging.wandb_mode=disabled",
        "--eval.episodes=0",
        "--logging.console=false",
        *extra,
    ]
