"""Checkpoints: DCP shards for model + optimizer, JSON for the rest, RNG per rank; and a
checkpoint turned back into full weights for a policy (`consolidate`, what `export` runs).

Frozen parameters are left out (as wall-x does): they never change, so resume and `consolidate`
restore them from the run's init source, and a checksum in `train_state.json` proves the init
source still holds the same values.

Every rank writes into its own staging directory; Ray Train merges them into one checkpoint and
registers it only after all ranks reported. DCP shards can be loaded at a different world size.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from raytrain_vla.common.atomic import write_text_atomic
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.config import from_tree
from raytrain_vla.policy.format import CHECKPOINT_META, NORMALIZATION, PolicyMeta, read_meta
from raytrain_vla.policy.integrity import verify_checkpoint
from raytrain_vla.train.init_source import build_init_source
from raytrain_vla.train.manifest import write_manifest
from raytrain_vla.train.train_state import (
    RNG_DIR,
    TRAIN_STATE,
    TrainState,
    check_frozen,
    frozen_checksum,
    read_train_state,
    rng_state,
    set_rng_state,
)
from raytrain_vla.train.write_behind import WriteBehindWriter

SCHEDULER = "scheduler.json"
CONFIG = "config.yaml"


def save_checkpoint(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_state: TrainState,
    rank: int,
    config_yaml: str,
    normalizer: Normalizer,
    policy: PolicyMeta,
    frozen: Collection[str] = (),
) -> None:
    """Collective: every rank calls it with its own `directory`.

    `policy` (the model family's config, data shapes, tasks) lets `consolidate` rebuild the
    model from the checkpoint alone. `frozen` parameters are not written.
    """
    write_sidecars(directory, scheduler, train_state, rank, config_yaml, normalizer, policy)
    write_tensors(directory, tensor_state(model, optimizer, frozen), rank)


def write_tensors(
    directory: Path, state: dict, rank: int, group: dist.ProcessGroup | None = None
) -> None:
    """Collective over `group`: DCP shards, then the manifest, which completes the checkpoint."""
    dcp.save(state, storage_writer=WriteBehindWriter(directory), process_group=group)
    write_manifest(directory, rank, group)  # last: a checkpoint with a manifest is complete


def tensor_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, frozen: Collection[str] = ()
) -> dict:
    """What DCP writes: model (but the frozen parameters) and optimizer, as this rank's shards."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": {k: v for k, v in model_sd.items() if k not in frozen},
        "optimizer": optim_sd,
    }


def write_sidecars(
    directory: Path,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_state: TrainState,
    rank: int,
    config_yaml: str,
    normalizer: Normalizer,
    policy: PolicyMeta,
) -> None:
    """Everything but the tensors: this rank's RNG, and on rank 0 the JSON/YAML files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RNG_DIR).mkdir(exist_ok=True)
    torch.save(rng_state(), directory / RNG_DIR / f"rank{rank}.pt")
    if rank == 0:
        write_text_atomic(directory / TRAIN_STATE, json.dumps(train_state.to_dict(), indent=2))
        write_text_atomic(directory / SCHEDULER, json.dumps(scheduler.state_dict(), indent=2))
        write_text_atomic(directory / CONFIG, config_yaml)
        normalizer.save(directory / NORMALIZATION)
        write_text_atomic(directory / CHECKPOINT_META, json.dumps(policy.to_dict(), indent=2))


def load_checkpoint(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    world_size: int,
    frozen: Collection[str] = (),
) -> TrainState:
    """Collective. Restores everything but the `frozen` parameters, which keep their values;
    RNG only when the world size is unchanged."""
    state = read_train_state(directory)
    loaded = tensor_state(model, optimizer, frozen)  # this rank's shards, on any mesh
    dcp.load(loaded, checkpoint_id=str(directory))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=loaded["model"],
        optim_state_dict=loaded["optimizer"],
        options=StateDictOptions(strict=not frozen),
    )
    scheduler.load_state_dict(json.loads((directory / SCHEDULER).read_text()))
    rng_file = directory / RNG_DIR / f"rank{rank}.pt"
    if state.world_size == world_size and rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=True))
    return state


def consolidate(
    checkpoint: Path, dtype: torch.dtype | None = None, shown_as: str | None = None
) -> tuple[dict[str, torch.Tensor], PolicyMeta, Normalizer]:
    """DCP shards of any world size -> full weights, holding one copy of the model in memory.

    Its files are first checked against the manifest: a damaged one is named in one line
    (`shown_as`: the URI of a downloaded copy) before DCP reads anything. The model is built
    on the meta device and allocated uninitialised; DCP fills every tensor it stored. A
    checkpoint that left frozen parameters out is loaded over the rebuilt init source instead,
    after its checksum is verified.
    """
    checkpoint = Path(checkpoint)
    verify_checkpoint(checkpoint, shown_as)
    for name in (CHECKPOINT_META, NORMALIZATION, ".metadata"):
        if not (checkpoint / name).is_file():
            raise FileNotFoundError(
                f"{checkpoint}: not a raytrain_vla training checkpoint (missing {name})"
            )
    meta = read_meta(checkpoint / CHECKPOINT_META)
    with torch.device("meta"):
        model = meta.family.build(meta.model_config)
    stored = stored_model_keys(checkpoint)
    if set(model.state_dict()) - stored:  # frozen while training: from the run's init source
        model = _init_source_of(checkpoint, meta, stored)
    else:
        model = model.to_empty(device="cpu")  # storage only: DCP fills every tensor
    state = model.state_dict()
    try:
        with warnings.catch_warnings():  # one process reading every shard is the intent
            warnings.filterwarnings("ignore", "torch.distributed is .*uninitialized")
            dcp.load(  # in the model's key order: a damaged shard fails alike in every process
                {"model": {k: v for k, v in state.items() if k in stored}},
                checkpoint_id=str(checkpoint),
            )
    except CheckpointException as err:  # a BaseException: it would escape the CLI's one line
        cause = next(iter(err.failures.values()))[0]
        why = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        raise ValueError(
            f"{shown_as or checkpoint}: DCP could not read the model from its shards ({why})"
        ) from err
    for key, tensor in state.items():  # one tensor at a time, so never two copies of the model
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            state[key] = tensor.to(dtype)
    return state, meta, Normalizer.load(checkpoint / NORMALIZATION)


def stored_model_keys(checkpoint: Path) -> set[str]:
    metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    prefix = "model."
    return {k[len(prefix) :] for k in metadata.state_dict_metadata if k.startswith(prefix)}


def _init_source_of(checkpoint: Path, meta: PolicyMeta, stored: set[str]) -> nn.Module:
    """Rebuild the run's init source and prove it still holds the frozen values trained with."""
    config_file = checkpoint / CONFIG
    cfg = from_tree(yaml.safe_load(config_file.read_text()), str(config_file))
    source = f"model.init_from={cfg.model.init_from or '(none: seeded init)'}"
    try:
        model = build_init_source(
            meta.family, meta.model_config, cfg.train.seed, cfg.model.init_from,
            cfg.model.init_allow,
        )  # fmt: skip
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{checkpoint} leaves out its frozen parameters, to be restored from {source}: {err}"
        ) from err
    frozen = [name for name, _ in model.named_parameters() if name not in stored]
    check_frozen(read_train_state(checkpoint), frozen_checksum(model, frozen), source)
    return model
