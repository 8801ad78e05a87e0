"""Flow-matching noise and time keyed to (seed, step, sample id), for every model family.

Keyed to the sample, not the rank, so any world size draws identical noise for a sample, and a
resumed run draws what the uninterrupted one did. The shape is the model's `noise_shape`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

VAL_STREAM = 0x7A1  # a step value training never uses, so validation noise is its own stream


def flow_noise_and_time(
    seed: int, step: int, sample_ids: Sequence[int], shape: tuple[int, int],
    beta: tuple[float, float] = (1.5, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per-sample noise (B, *shape) and time (B,); t ~ Beta(1.5, 1) mapped to [0.001, 1] as in
    openpi (more weight on noisy times)."""
    noise = np.empty((len(sample_ids), *shape), dtype=np.float32)
    time = np.empty(len(sample_ids), dtype=np.float32)
    for i, sid in enumerate(sample_ids):
        rng = np.random.default_rng([int(seed), int(step), int(sid)])
        noise[i] = rng.standard_normal(tuple(shape), dtype=np.float32)
        time[i] = rng.beta(*beta) * 0.999 + 0.001
    return torch.from_numpy(noise), torch.from_numpy(time)
