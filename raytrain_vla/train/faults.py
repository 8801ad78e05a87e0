"""Fault injection for the reliability tests: a worker SIGKILL, a crash inside a checkpoint write,
bad data found mid-run.

The first two fire once per run directory (a marker file, created exclusively, records it), so the restarted attempt
runs clean and the test can compare it with an uninterrupted run. Bad data fires on every
attempt, as a real bad file would.
"""

from __future__ import annotations

import os
import signal
import time

from raytrain_vla.common.run_storage import RunPath, create_exclusive
from raytrain_vla.config.schema import DebugConfig
from raytrain_vla.data.formats.lerobot_common import DatasetError


def _once(run_dir: RunPath, name: str) -> bool:
    """True the first time `name` is claimed for this run directory (local or object store)."""
    return create_exclusive(run_dir / f".fault_{name}", str(time.time()).encode())


def after_step(cfg: DebugConfig, step: int, rank: int, run_dir: RunPath) -> None:
    """SIGKILL this worker process once, right after optimizer step `cfg.kill_at_step`."""
    if step == cfg.kill_at_step and rank == cfg.kill_rank and _once(run_dir, f"kill_{step}"):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == cfg.bad_data_at_step and rank == cfg.kill_rank:
        raise DatasetError(f"injected bad data after step {step} (debug.bad_data_at_step)")


def in_checkpoint_write(cfg: DebugConfig, step: int, rank: int, run_dir: RunPath) -> None:
    """Crash once between writing this rank's shards and reporting the checkpoint."""
    if (
        step == cfg.crash_in_checkpoint_at_step
        and rank == cfg.kill_rank
        and _once(run_dir, f"ckpt_{step}")
    ):
        raise RuntimeError(f"injected crash while writing the checkpoint of step {step}")
