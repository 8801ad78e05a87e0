"""What a checkpoint records besides tensors: the train state, RNG states, frozen checksums.

Pure (no distributed state), so it round-trips in unit tests.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

TRAIN_STATE = "train_state.json"
RNG_DIR = "rng"


@dataclass(kw_only=True)
class TrainState:
    step: int  # completed optimizer steps
    epoch: int
    sample_in_epoch: int
    samples_seen: int
    world_size: int
    run_name: str
    config_hash: str
    dataset_fingerprint: str
    # The sample order's algorithm (data/plan.py PLAN_VERSION); checkpoints without it used 1.
    sample_plan: int = 1
    # Sum and sum of squares (float64) of the parameters left out because they are frozen.
    frozen_params: int = 0
    frozen_checksum: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["versions"] = {
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        }
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainState:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in fields})


def frozen_checksum(model: nn.Module, frozen: Collection[str]) -> list[float]:
    """[sum, sum of squares] in float64 over the frozen parameters of a whole (unsharded)
    model: the trainer's init source on rank 0, or the one `consolidate` rebuilds."""
    params = dict(model.named_parameters())
    acc = torch.zeros(2, dtype=torch.float64)
    for name in sorted(frozen):
        value = params[name].detach().double()
        acc += torch.stack([value.sum(), value.square().sum()]).cpu()
    return acc.tolist()


def check_frozen(state: TrainState, checksum: list[float], source: str) -> None:
    """The frozen parameters a checkpoint left out must come back with the same values."""
    if not state.frozen_params:
        return
    scale = 1e-9 * max(1.0, abs(state.frozen_checksum[1]))
    if any(abs(a - b) > scale for a, b in zip(checksum, state.frozen_checksum, strict=True)):
        raise ValueError(
            f"checkpoint of run '{state.run_name}' left out its {state.frozen_params} frozen "
            f"parameters, but {source} no longer gives the values it trained with (checksum "
            f"{checksum} vs {state.frozen_checksum}); restore the init source or use a new ray.run_name"
        )


def rng_state() -> dict:
    """Python, numpy and torch global RNG states in a form `weights_only` loading accepts."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "python_version": py_state[0],
        "python_state": torch.tensor(py_state[1], dtype=torch.int64),
        "python_gauss": py_state[2],
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "numpy_has_gauss": int(np_state[3]),
        "numpy_cached_gaussian": float(np_state[4]),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(
        (state["python_version"], tuple(state["python_state"].tolist()), state["python_gauss"])
    )
    np.random.set_state(
        (
            "MT19937",
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])


def read_train_state(directory: Path) -> TrainState:
    path = directory / TRAIN_STATE
    if not path.is_file():
        raise ValueError(f"{directory}: not a complete checkpoint (missing {TRAIN_STATE})")
    try:
        data = json.loads(path.read_text())
        return TrainState.from_dict(data)
    except (ValueError, TypeError, AttributeError) as err:  # garbage, a list, missing fields
        raise ValueError(
            f"{path}: not a train state ({' '.join(str(err).split())}); the checkpoint is damaged"
        ) from err
