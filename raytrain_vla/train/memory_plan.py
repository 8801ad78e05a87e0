"""Per-rank memory of a training run, computed before any GPU is rented (`plan-memory`).

Sizes come from the model built on the meta device (nothing allocated) and from the layout the
trainer gives it: FSDP2 over a (replicate x shard) mesh (`train/mesh.py`), frozen parameters
replicated or sharded by `train/frozen.place_frozen`, AdamW. Per rank, with `shard` the
shard-group size:

* params: the trained parameters' fp32 master shards (FSDP2 pads dim 0 to a multiple of shard);
* grads: their fp32 gradient shards (the reduce-scatter's output, `reduce_dtype` fp32);
* optimizer: AdamW's exp_avg and exp_avg_sq, fp32, shaped like the shards (8 B / param / shard);
  with `optimizer.type=muon`, the matrices Muon updates keep its one momentum buffer (4 B);
* frozen: replicated, a full copy in the compute dtype; sharded, fp32 shards like the trained;
* gathered: what FSDP2 all-gathers for compute, in the compute dtype: the root's own parameters
  (kept gathered, `reshard_after_forward=False`), the largest unit twice (it and the one
  prefetched) or, without resharding after forward, every unit; plus the largest unit's
  unsharded gradient and the fp32 reduce-scatter input it is copied into;
* activations: the bytes autograd keeps for backward at the end of one micro-batch's forward,
  counted on the real model (`measure_activations`), with and without activation checkpointing;
* step transient: foreach AdamW's sqrt(exp_avg_sq) copy of the largest LR group, fp32.

The peak is `params + optimizer + frozen + grads + max(gathered + activations, step transient)`:
gradients are counted whole next to the whole forward's activations (backward frees the
activations as it makes the gradients, so this errs high), and the optimizer step runs after
the activations are gone. With `train.cpu_offload` the sharded state lives in host memory and
only frozen replicas, gathered units and activations count against the GPU.

`benchmarks/memory_model_check.py` checks the sum against the peak RSS of real CPU steps.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import Config, ConfigError, check_batch_layout
from raytrain_vla.config.schema import Precision, TrainConfig
from raytrain_vla.data.mixture import open_view
from raytrain_vla.models.base import InputProcessor, VLAModel
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.flops import example_columns
from raytrain_vla.train.frozen import compute_dtype, frozen_bytes, place_frozen
from raytrain_vla.train.materialize import meta_model
from raytrain_vla.train.mesh import mesh_shape
from raytrain_vla.train.muon import muon_parameter_names
from raytrain_vla.train.optim import ParamGroup, freeze_for_config, resolve_groups
from raytrain_vla.train.preflight import check_model_fits_data

GB = 1e9  # GPU memory is sold in these; 80 GB = 80e9 bytes
FP32 = 4
ADAMW_STATES = 2  # exp_avg and exp_avg_sq, each the parameter's shape, fp32
MUON_STATES = 1  # the momentum buffer, the parameter's shape, fp32


@dataclass(frozen=True)
class Activations:
    """Bytes autograd holds for backward at the end of one micro-batch's forward, parameters
    and buffers left out (they are counted as model state)."""

    micro_batch: int
    plain: int  # without activation checkpointing
    # With it: what is saved outside the checkpointed units, the units' inputs (checkpointing
    # keeps them to recompute from) and the largest unit's own saves while it is recomputed.
    checkpointed: int
    # "meta" (the whole micro-batch on the meta device), or "cpu" when the forward needs real
    # values (data-dependent shapes): one and two samples on CPU, extrapolated linearly.
    measured_on: str


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's bytes for one world size; `total` is what must fit in `gpu_memory_bytes`."""

    world_size: int
    replicate: int
    shard: int
    precision: Precision
    frozen_placement: str  # "replicate", "shard" or "none" (nothing frozen)
    params: int
    grads: int
    optimizer: int
    frozen: int
    gathered: int
    activations: int  # with or without checkpointing, as train.activation_checkpointing says
    activations_plain: int
    activations_checkpointed: int
    step_transient: int
    host: int  # the sharded state train.cpu_offload keeps in host memory instead
    total: int
    gpu_memory_bytes: int
    fits: bool
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunPlan:
    """A run's plan at each of its world sizes, and what it was computed from."""

    model_type: str
    params: int
    trained: int
    frozen: int
    micro_batch: int
    activations: Activations
    plans: list[MemoryPlan]


# --- the model's sizes ----------------------------------------------------------------------------


def shard_numel(param: torch.Tensor, shard: int) -> int:
    """Elements of one rank's shard: FSDP2 splits dim 0 into `shard` equal, padded chunks."""
    if param.dim() == 0:
        return 1
    rows = param.shape[0]
    return math.ceil(rows / shard) * (param.numel() // max(rows, 1))


def _own_params(module: nn.Module, inner: list[nn.Module]) -> list[tuple[str, nn.Parameter]]:
    """`module`'s parameters that no nested unit in `inner` manages (what its own
    `fully_shard` gathers)."""
    nested = {id(p) for m in inner if m is not module for p in m.parameters()}
    return [(n, p) for n, p in module.named_parameters() if id(p) not in nested]


def unit_numels(model: VLAModel, include: Collection[str]) -> tuple[list[int], int]:
    """Elements each FSDP unit gathers and the root's own, counting the parameters named in
    `include` (trained, plus frozen ones when they are sharded)."""
    names = {id(p): n for n, p in model.named_parameters()}
    keep = set(include)
    units = list(model.fsdp_units())
    sizes = [
        sum(p.numel() for _, p in _own_params(u, units) if names[id(p)] in keep) for u in units
    ]
    in_units = {id(p) for u in units for p in u.parameters()}
    root = sum(
        p.numel() for n, p in model.named_parameters() if id(p) not in in_units and n in keep
    )
    return sizes, root


# --- the plan -------------------------------------------------------------------------------------


def plan(
    model: VLAModel,
    frozen: Collection[str],
    train: TrainConfig,
    world_size: int,
    activations: Activations,
    gpu_memory_gb: float = 80.0,
    groups: list[ParamGroup] | None = None,
    fsdp: bool = True,
    muon: Collection[str] = (),
) -> MemoryPlan:
    """One rank's memory for `world_size` workers. `frozen` names the parameters that train
    does not update (`freeze_for_config`); `groups` the LR groups (their largest sets the
    optimizer step's transient; None: one group). `fsdp=False` is one plain process (no
    sharding, no gathered copies), what `benchmarks/memory_model_check.py` measures. `muon`
    names the parameters Muon updates (`optimizer.type=muon`): one state each, not AdamW's two."""
    gpu_bytes = int(gpu_memory_gb * GB)
    replicate, shard = mesh_shape(world_size, train.dp_shard) if fsdp else (1, 1)
    frozen_set = set(frozen)
    params = dict(model.named_parameters())
    trained = [n for n in params if n not in frozen_set]
    cbytes = torch.tensor([], dtype=compute_dtype(train.precision)).element_size()

    def shard_bytes(names: Collection[str]) -> int:
        return sum(shard_numel(params[n], shard) * FP32 for n in names)

    p_bytes = shard_bytes(trained)
    muon_set = set(muon)
    grads = p_bytes
    optimizer = ADAMW_STATES * shard_bytes([n for n in trained if n not in muon_set])
    optimizer += MUON_STATES * shard_bytes([n for n in trained if n in muon_set])
    placement = "none"
    frozen_b = 0
    if frozen_set:
        full_copy = frozen_bytes(model, frozen_set, train.precision)
        placement = place_frozen(train.frozen_params, full_copy, gpu_bytes) if fsdp else "replicate"
        frozen_b = full_copy if placement == "replicate" else shard_bytes(frozen_set)

    gathered = 0
    notes = []
    if fsdp:
        include = trained + (list(frozen_set) if placement == "shard" else [])
        sizes, root = unit_numels(model, include)
        if train.reshard_after_forward:
            held = 2 * max(sizes, default=0)  # the unit computing and the one prefetched
        else:
            held = sum(sizes)  # every unit stays gathered from its forward to its backward
        trained_sizes, trained_root = unit_numels(model, trained)
        largest_grad = max([*trained_sizes, trained_root])
        # Its unsharded gradient (compute dtype) and the fp32 reduce-scatter input it is cast
        # and copied into.
        gathered = (root + held) * cbytes + largest_grad * (cbytes + FP32)
        if not train.reshard_after_forward:
            notes.append("train.reshard_after_forward=false: every unit stays gathered")

    group_names = [g.param_names for g in groups] if groups else [trained]
    step_transient = max((shard_bytes(names) for names in group_names), default=0)
    acts = activations.checkpointed if train.activation_checkpointing else activations.plain
    # What the GPU holds throughout, then the larger of the two phases: forward and backward
    # (gathered units, activations), or the optimizer step after them.
    host = 0
    if train.cpu_offload and fsdp:  # FSDP2 keeps every shard and steps AdamW on the host
        sharded_frozen = frozen_b if placement == "shard" else 0
        host = p_bytes + grads + optimizer + sharded_frozen + step_transient
        notes.append("train.cpu_offload: the sharded state and the optimizer step in host memory")
        total = (frozen_b - sharded_frozen) + gathered + acts
    else:
        total = p_bytes + optimizer + frozen_b + grads + max(gathered + acts, step_transient)
    return MemoryPlan(
        world_size=world_size, replicate=replicate, shard=shard, precision=train.precision,
        frozen_placement=placement, params=p_bytes, grads=grads, optimizer=optimizer,
        frozen=frozen_b, gathered=gathered, activations=acts,
        activations_plain=activations.plain, activations_checkpointed=activations.checkpointed,
        step_transient=step_transient, host=host, total=total, gpu_memory_bytes=gpu_bytes,
        fits=total <= gpu_bytes, notes=notes,
    )  # fmt: skip


# --- activations ----------------------------------------------------------------------------------


def example_micro_batch(
    processor: InputProcessor, spec: DataSpec, tasks: list[str], size: int
) -> dict[str, Any]:
    """`size` copies of one sample in the dataset's layout (black frames, zero state and
    actions) with its longest instruction, collated on CPU as the trainer's batches are: the
    text length sets the sequence length."""
    cols = example_columns(spec, tasks)
    longest = int(np.argmax([len(str(t)) for t in cols["task"]]))
    cols = {k: np.repeat(v[longest : longest + 1], size, axis=0) for k, v in cols.items()}
    cols["sample_id"] = np.arange(size, dtype=np.int64)
    return processor.collate(processor.encode(cols), "cpu")


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(storage identity, bytes); views of one tensor share it. Works on meta too."""
    try:
        storage = t.untyped_storage()
        return storage._cdata, storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without storage
        return id(t), t.numel() * t.element_size()


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return (x for x in leaves if isinstance(x, torch.Tensor))


def _cast_inputs(dtype: torch.dtype):
    """FSDP2's `cast_forward_inputs` for a unit: floating inputs in the compute dtype."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def cast(x: Any) -> Any:
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        return tree_map(cast, args), tree_map(cast, kwargs)

    return hook


def _saved_bytes(model: VLAModel, batch: dict, dtype: torch.dtype) -> tuple[int, int]:
    """(plain, checkpointed) bytes autograd saves in one forward of `batch`.

    Each saved tensor is attributed to the activation-checkpointing unit whose forward saved it
    (or to none); storages are counted once, parameters and buffers never."""
    device = next(model.parameters()).device
    state = {_storage_key(t)[0] for t in [*model.parameters(), *model.buffers()]}
    units = model.activation_checkpoint_units()
    current: list[int] = []
    # storage -> (unit index or None, bytes, the tensor: kept alive so no key is reused)
    saved: dict[int, tuple[int | None, int, torch.Tensor]] = {}
    inputs: dict[int, tuple[int, torch.Tensor]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(t)
        if key not in state and key not in saved:
            saved[key] = (current[0] if current else None, nbytes, t)
        return t

    def enter(index: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            current.append(index)
            for t in _tensors((args, kwargs)):
                key, nbytes = _storage_key(t)
                if key not in state:
                    inputs[key] = (nbytes, t)

        return hook

    def leave(module: nn.Module, args: tuple, output: Any) -> None:
        current.pop()

    handles = []
    for i, unit in enumerate(units):
        handles.append(unit.register_forward_pre_hook(enter(i), with_kwargs=True))
        handles.append(unit.register_forward_hook(leave))
    if dtype != torch.float32:
        for unit in model.fsdp_units():
            cast = _cast_inputs(dtype)  # before `enter`: checkpointing keeps the cast inputs
            handles.append(unit.register_forward_pre_hook(cast, with_kwargs=True, prepend=True))
    n = len(batch["sample_ids"])
    noise = torch.zeros((n, *model.noise_shape), device=device)
    time = torch.full((n,), 0.5, device=device)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.compute_loss(_to(batch, device), noise, time)
        del loss
    finally:
        for h in handles:
            h.remove()
    per_unit: dict[int | None, int] = {}
    for unit, nbytes, _ in saved.values():
        per_unit[unit] = per_unit.get(unit, 0) + nbytes
    plain = sum(per_unit.values())
    kept = {k: b for k, (u, b, _) in saved.items() if u is None}
    kept.update({k: b for k, (b, _) in inputs.items()})
    recompute = {}
    for key, (unit, nbytes, _) in saved.items():
        if unit is not None and key not in kept:
            recompute[unit] = recompute.get(unit, 0) + nbytes
    checkpointed = sum(kept.values()) + max(recompute.values(), default=0)
    return plain, checkpointed


def _to(batch: Any, device: torch.device) -> Any:
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, batch)


def _in_compute_dtype(model: VLAModel, precision: Precision) -> VLAModel:
    """A copy whose floating parameters are in the compute dtype, as FSDP2's mixed precision
    gathers them (frozen flags kept: what autograd saves depends on them)."""
    work = copy.deepcopy(model)
    dtype = compute_dtype(precision)
    for p in work.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return work


def measure_activations(
    model: VLAModel, micro_batch: dict, precision: Precision, size: int
) -> Activations:
    """Activation bytes of one micro-batch of `size` samples (`micro_batch` holds `size`
    copies of one example, collated on CPU), counted with `saved_tensors_hooks` on a copy of
    the meta `model`.

    A forward whose shapes depend on values (a family trimming text padding) cannot run on
    meta: then the copy is allocated once on CPU in the compute dtype (zeroed) and runs one and
    two samples; the bytes grow linearly from the first by the difference (what does not grow
    with the batch, e.g. position tables, masks broadcast over it, is counted once)."""
    if next(model.parameters()).device.type != "meta":
        raise ValueError("measure_activations takes the model built on the meta device")
    work = _in_compute_dtype(model, precision)
    dtype = compute_dtype(precision)
    try:
        plain, checkpointed = _saved_bytes(work, micro_batch, dtype)
        return Activations(size, plain, checkpointed, "meta")
    except Exception:  # noqa: BLE001 - meta has no values; a real error recurs on CPU below
        pass
    work.to_empty(device="cpu")
    with torch.no_grad():
        for t in [*work.parameters(), *work.buffers()]:
            t.zero_()
    one, two = (_first(micro_batch, n) for n in (1, min(2, size)))
    p1, c1 = _saved_bytes(work, one, dtype)
    p2, c2 = _saved_bytes(work, two, dtype) if size > 1 else (p1, c1)
    grow = size - 1
    return Activations(size, p1 + (p2 - p1) * grow, c1 + (c2 - c1) * grow, "cpu")


def _first(batch: dict, n: int) -> dict:
    """The first `n` samples of a collated batch."""
    return tree_map(lambda x: x[:n] if isinstance(x, torch.Tensor) and x.dim() else x, batch)


# --- a run's config -------------------------------------------------------------------------------


def run_world_sizes(cfg: Config) -> list[int]:
    """Every world size `ray.num_workers` allows (one, or each of an elastic [min, max])."""
    workers = cfg.ray.num_workers
    lo, hi = (workers, workers) if isinstance(workers, int) else workers
    return list(range(lo, hi + 1))


def plan_run(cfg: Config, world_sizes: list[int], gpu_memory_gb: float) -> RunPlan:
    """The plan of `cfg` (its dataset must exist: the model is resolved against its shapes) at
    each world size; a world size the batch layout or `train.dp_shard` does not allow is a
    ConfigError, as it would be for `train`."""
    for world in world_sizes:
        check_batch_layout(cfg.train.global_batch_size, cfg.train.micro_batch_size, world)
        try:
            mesh_shape(world, cfg.train.dp_shard)
        except ValueError as err:
            raise ConfigError(str(err)) from err
    config, spec = check_model_fits_data(cfg)
    family = get_family(cfg.model.type)
    view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    model = meta_model(family, config)
    frozen = freeze_for_config(model, cfg.optimizer)
    try:
        groups = resolve_groups(model, cfg.optimizer)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    micro = cfg.train.micro_batch_size
    batch = example_micro_batch(family.processor(config, view.normalizer), spec, view.tasks, micro)
    acts = measure_activations(model, batch, cfg.train.precision, micro)
    total = sum(p.numel() for p in model.parameters())
    n_frozen = sum(model.get_parameter(n).numel() for n in frozen)
    muon = (
        muon_parameter_names(model, cfg.optimizer.muon.exclude_patterns)
        if cfg.optimizer.type == "muon"
        else set()
    )
    plans = [
        plan(model, frozen, cfg.train, w, acts, gpu_memory_gb, groups, muon=muon)
        for w in world_sizes
    ]
    return RunPlan(family.name, total, total - n_frozen, n_frozen, micro, acts, plans)
