"""Checkpoint state: DCP shards for model + optimizer, JSON for the rest, RNG per rank.

Every rank writes into its own staging directory; Ray Train merges them into one checkpoint and
registers it only after all ranks reported. DCP shards can be loaded at a different world size.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

TRAIN_STATE = "train_state.json"
SCHEDULER = "scheduler.json"
CONFIG = "config.yaml"
NORMALIZATION = "normalization.json"
RNG_DIR = "rng"
POLICY = "policy.json"  # export.POLICY_META


@dataclass
class TrainState:
    step: int  # completed optimizer steps
    epoch: int
    sample_in_epoch: int
    samples_seen: int
    world_size: int
    run_name: str
    config_hash: str
    dataset_fingerprint: str

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


def save_checkpoint(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_state: TrainState,
    rank: int,
    config_yaml: str,
    normalization: dict,
    policy: dict,
) -> None:
    """Collective: every rank calls it with its own `directory`.

    `policy` (model type and builder arguments, tasks, mean action) lets `export` rebuild the
    model from the checkpoint alone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(directory))
    (directory / RNG_DIR).mkdir(exist_ok=True)
    torch.save(rng_state(), directory / RNG_DIR / f"rank{rank}.pt")
    if rank == 0:
        (directory / TRAIN_STATE).write_text(json.dumps(train_state.to_dict(), indent=2))
        (directory / SCHEDULER).write_text(json.dumps(scheduler.state_dict(), indent=2))
        (directory / CONFIG).write_text(config_yaml)
        (directory / NORMALIZATION).write_text(json.dumps(normalization, indent=2))
        (directory / POLICY).write_text(json.dumps(policy, indent=2))


def read_train_state(directory: Path) -> TrainState:
    path = directory / TRAIN_STATE
    if not path.is_file():
        raise ValueError(f"{directory}: not a complete checkpoint (missing {TRAIN_STATE})")
    return TrainState.from_dict(json.loads(path.read_text()))


def load_checkpoint(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    world_size: int,
) -> TrainState:
    """Collective. Restores everything; RNG only when the world size is unchanged."""
    state = read_train_state(directory)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    loaded = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(loaded, checkpoint_id=str(directory))
    set_state_dict(
        model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"]
    )
    scheduler.load_state_dict(json.loads((directory / SCHEDULER).read_text()))
    rng_file = directory / RNG_DIR / f"rank{rank}.pt"
    if state.world_size == world_size and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=True))
    return state
