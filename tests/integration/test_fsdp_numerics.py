"""FSDP2 numerics on 2 gloo ranks (no Ray): gradients, accumulation, NaN guard, freezing, and
filling meta-device shards from rank 0.

Each check spawns two processes that shard the tiny model exactly as the Ray loop does, then
compares against one unsharded process on the same global batch.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist
from _spawn import run_distributed
from torch.distributed.device_mesh import init_device_mesh

from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.models.registry import get_family
from raytrain_vla.train import comm
from raytrain_vla.train.comm import reduce_scatter_by_all_reduce
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.init_source import build_init_source
from raytrain_vla.train.materialize import materialize_from_rank0, meta_model
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.step import StepRunner

GLOBAL_BATCH = 8
CHUNK, ACTION_DIM = 8, 2
FAMILY = get_family("flow_vla")
TINY = FlowVLAConfig.from_size("tiny")


def global_batch(seed: int = 0) -> dict:
    """A fixed synthetic global batch with mixed instructions and some padded chunk positions."""
    g = torch.Generator().manual_seed(seed)
    texts = ["reach the red disc", "go to the blue one", "move to the green target", "x"] * 2
    tokens, mask = tokenize(texts, 48)
    pad = torch.zeros(GLOBAL_BATCH, CHUNK, dtype=torch.bool)
    pad[1, 5:] = pad[6, 2:] = True
    return {
        "sample_ids": torch.arange(100, 100 + GLOBAL_BATCH),
        "images": {"observation.image": torch.rand(GLOBAL_BATCH, 3, 32, 32, generator=g)},
        "state": torch.randn(GLOBAL_BATCH, 2, generator=g),
        "text_tokens": tokens,
        "text_mask": mask,
        "actions": torch.randn(GLOBAL_BATCH, CHUNK, ACTION_DIM, generator=g),
        "action_is_pad": pad,
    }


def split(batch: dict, start: int, size: int) -> dict:
    out = {k: v[start : start + size] for k, v in batch.items() if k != "images"}
    out["images"] = {k: v[start : start + size] for k, v in batch["images"].items()}
    return out


def make_runner(
    world: int, optimizer_cfg: OptimizerConfig, nan_loss_step: int = -1
) -> tuple[torch.nn.Module, StepRunner]:
    torch.manual_seed(0)
    model = FAMILY.build(TINY)
    freeze_for_config(model, optimizer_cfg)
    groups = resolve_groups(model, optimizer_cfg)
    if world > 1:
        apply_fsdp(model, init_device_mesh("cpu", (world,)), TrainConfig())
    optimizer = build_optimizer(model, groups, optimizer_cfg)
    scheduler = build_scheduler(optimizer, 10, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step, ids):
        return flow_noise_and_time(0, step, ids, (CHUNK, ACTION_DIM))

    return model, StepRunner(
        model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0, nan_loss_step=nan_loss_step
    )


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad
            out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }


# -- the per-rank programs ---------------------------------------------------------------------


def dist_grads(rank: int, world: int) -> dict:
    """Gradients with gloo's reduce-scatters carried as all-reduces (`train/comm.py`, counted),
    and again with gloo's own reduce-scatter: the default run's digits need them bitwise equal."""
    calls = []

    def counted(*args):
        calls.append(1)
        return reduce_scatter_by_all_reduce(*args)

    def gloos_own(output, flat_input, group, op):
        dist.reduce_scatter_tensor(output, flat_input, op=op, group=group)

    per_rank = GLOBAL_BATCH // world
    grads = {}
    for path, reduce_scatter in (("all_reduce", counted), ("gloo_reduce_scatter", gloos_own)):
        with mock.patch.object(comm, "reduce_scatter_by_all_reduce", reduce_scatter):
            model, runner = make_runner(world, OptimizerConfig())
            runner.accumulate(0, [split(global_batch(), rank * per_rank, per_rank)])
        grads[path] = full_grads(model)
    return {**grads, "reduce_scatters_by_all_reduce": len(calls)}


def dist_accumulated_update(rank: int, world: int) -> dict:
    """Gradients and updated weights for one micro-batch of 4 vs 2 micro-batches of 2 per rank.

    AdamW's first step is lr * g / (|g| + eps): with the default eps it flips sign on gradients
    that are ~0 up to float noise, so eps is raised to keep the update continuous in g.
    """
    per_rank = GLOBAL_BATCH // world
    mine = split(global_batch(), rank * per_rank, per_rank)
    out = {}
    for micro in (per_rank, per_rank // 2):
        model, runner = make_runner(world, OptimizerConfig(eps=1e-3))
        sums = runner.accumulate(0, [split(mine, i, micro) for i in range(0, per_rank, micro)])
        out.update({f"micro{micro}/grad/{n}": g for n, g in full_grads(model).items()})
        runner.update(*sums)
        out.update({f"micro{micro}/param/{n}": p for n, p in full_params(model).items()})
    return out


def dist_nan_guard(rank: int, world: int) -> dict:
    model, runner = make_runner(world, OptimizerConfig(), nan_loss_step=1 if rank == 1 else -1)
    per_rank = GLOBAL_BATCH // world
    metrics = [
        runner.run(step, [split(global_batch(step), rank * per_rank, per_rank)])
        for step in range(3)
    ]
    params = full_params(model)
    return {
        "zeroed": torch.tensor([m["nonfinite_losses_zeroed"] for m in metrics]),
        "skipped": torch.tensor([m["update_skipped"] for m in metrics]),
        "finite": torch.tensor(all(bool(torch.isfinite(p).all()) for p in params.values())),
    }


def dist_frozen(rank: int, world: int) -> dict:
    cfg = OptimizerConfig(train_action_expert_only=True)
    model, runner = make_runner(world, cfg)
    before = full_params(model)
    per_rank = GLOBAL_BATCH // world
    runner.accumulate(0, [split(global_batch(), rank * per_rank, per_rank)])
    with_grad = sorted(full_grads(model))
    runner.update(*runner.accumulate(1, [split(global_batch(1), rank * per_rank, per_rank)]))
    after = full_params(model)
    changed = sorted(n for n in before if not torch.equal(before[n], after[n]))
    return {"with_grad": with_grad, "changed": changed, "all": sorted(before)}


def dist_materialize(rank: int, world: int) -> dict:
    """Only rank 0 builds real weights; rank 1 starts from meta and gets just its shards."""
    source = build_init_source(FAMILY, TINY, seed=5) if rank == 0 else None
    model = meta_model(FAMILY, TINY)
    apply_fsdp(model, init_device_mesh("cpu", (world,)), TrainConfig())
    materialize_from_rank0(model, source.state_dict() if source else None, torch.device("cpu"))
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    counts = torch.zeros(world, 2, dtype=torch.int64)
    counts[rank] = torch.tensor([local, total])
    dist.all_reduce(counts)
    return {"params": full_params(model), "counts": counts}


# -- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_grads() -> dict[str, torch.Tensor]:
    model, runner = make_runner(1, OptimizerConfig())
    runner.accumulate(0, [global_batch()])
    return full_grads(model)


def test_fsdp2_gradients_match_one_process(tmp_path, reference_grads):
    result = run_distributed(dist_grads, tmp_path)
    assert result["reduce_scatters_by_all_reduce"] > 0
    sharded = result["all_reduce"]
    for name, grad in result["gloo_reduce_scatter"].items():
        assert torch.equal(sharded[name], grad), f"{name}: not bitwise gloo's reduce-scatter"
    assert sharded.keys() == reference_grads.keys()
    for name, ref in reference_grads.items():
        torch.testing.assert_close(sharded[name], ref, rtol=1e-5, atol=1e-5, msg=name)


def test_gradient_accumulation_matches_one_micro_batch(tmp_path):
    out = run_distributed(dist_accumulated_update, tmp_path)
    per_rank = GLOBAL_BATCH // 2

    def pick(micro: int, kind: str) -> dict:
        prefix = f"micro{micro}/{kind}/"
        return {k[len(prefix) :]: v for k, v in out.items() if k.startswith(prefix)}

    torch.manual_seed(0)
    initial = FAMILY.build(TINY).state_dict()
    whole, accumulated = pick(per_rank, "param"), pick(per_rank // 2, "param")
    assert any(not torch.equal(whole[n], initial[n]) for n in whole), "the update changed nothing"
    for name, grad in pick(per_rank, "grad").items():
        torch.testing.assert_close(pick(per_rank // 2, "grad")[name], grad, rtol=1e-5, atol=1e-6)
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], rtol=1e-5, atol=1e-6, msg=name)


def test_nan_loss_on_one_rank_does_not_hang_and_keeps_training(tmp_path):
    result = run_distributed(dist_nan_guard, tmp_path)
    assert result["zeroed"].tolist() == [0.0, 1.0, 0.0]
    assert result["skipped"].tolist() == [0.0, 0.0, 0.0]
    assert bool(result["finite"])


def test_frozen_parameters_get_no_gradient_and_do_not_change(tmp_path):
    result = run_distributed(dist_frozen, tmp_path)
    role_of = FAMILY.model_type.role_of
    trainable = [n for n in result["all"] if role_of(n) == "action_expert"]
    assert result["with_grad"] == trainable
    assert set(result["changed"]) <= set(trainable) and result["changed"]


def test_meta_shards_are_filled_from_rank0_alone(tmp_path):
    result = run_distributed(dist_materialize, tmp_path)
    expected = build_init_source(FAMILY, TINY, seed=5).state_dict()
    assert result["params"].keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(result["params"][name], value, rtol=0, atol=0, msg=name)
    (local0, total), (local1, _) = result["counts"].tolist()
    assert local0 + local1 == total and local1 <= 0.55 * total  # rank 1 holds about half
