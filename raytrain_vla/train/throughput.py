"""Step timing per log window: samples/s, step time, the share spent waiting for data, FLOP/s.

Validation, checkpoints and evaluation stay out of the window: its clock restarts after them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


class ThroughputMeter:
    def __init__(
        self,
        global_batch_size: int,
        flops_per_sample: float,
        peak_tflops: float,
        world_size: int,
        device: torch.device,
    ):
        self.global_batch_size = global_batch_size
        self.flops_per_sample = flops_per_sample
        self.peak_tflops = peak_tflops
        self.world_size = world_size
        self.device = device
        self.start, self.wait, self.steps = time.perf_counter(), 0.0, 0

    def fetch(self, get: Callable[[], T]) -> T:
        """`get()`, its time counted as waiting for data."""
        t0 = time.perf_counter()
        out = get()
        self.wait += time.perf_counter() - t0
        return out

    def step_done(self) -> None:
        self.steps += 1

    def window_metrics(self) -> dict[str, float]:
        """Metrics of the steps since the last call; starts a new window."""
        elapsed = time.perf_counter() - self.start
        out = {
            "samples_per_s": self.steps * self.global_batch_size / elapsed,
            "step_time_s": elapsed / self.steps,
            "data_wait_share": self.wait / elapsed,
        }
        out["tflops_per_s"] = out["samples_per_s"] * self.flops_per_sample / 1e12
        if self.peak_tflops:
            out["mfu"] = out["tflops_per_s"] / (self.peak_tflops * self.world_size)
        if self.device.type == "cuda":
            out["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.wait, self.steps = 0.0, 0
        return out

    def restart_if_idle(self) -> None:
        """After a step's hooks: a window with no steps yet starts now."""
        if self.steps == 0:
            self.start = time.perf_counter()
