"""HSDP and frozen-weight placement on 4 gloo ranks (no Ray), against one unsharded process.

One spawn of 4 ranks runs every mesh: 2x2 (HSDP) and 1x4 train the same steps; a checkpoint
written in the background on 1x4 resumes on 2x2 and on 4 ranks flat with the same next loss and
weights; frozen weights replicated in the compute dtype give the losses of sharded ones.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from _spawn import run_distributed
from test_fsdp_numerics import ACTION_DIM, CHUNK, FAMILY, GLOBAL_BATCH, TINY, global_batch, split

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import Config, to_yaml
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.policy.format import PolicyMeta
from raytrain_vla.train.checkpoint import load_checkpoint, tensor_state, write_sidecars
from raytrain_vla.train.checkpoint_saver import CheckpointSaver
from raytrain_vla.train.comm import CommCounter
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.init_source import build_init_source
from raytrain_vla.train.materialize import gather_full_state, materialize_from_rank0, meta_model
from raytrain_vla.train.mesh import build_mesh, mesh_shape
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.step import StepRunner
from raytrain_vla.train.train_state import TrainState

WORLD = 4
STEPS = 2
# AdamW's first update is lr * g / (|g| + eps): with the default eps, gradients that are ~0 up
# to float noise flip sign between reduction orders; a larger eps keeps the update continuous.
ADAMW = OptimizerConfig(eps=1e-3)
EXPERT_ONLY = OptimizerConfig(eps=1e-3, train_action_expert_only=True)
STATS = {
    "observation.state": {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
    "action": {"mean": [0.0, 0.0], "std": [0.03, 0.03]},
}


def build(
    rank: int, world: int, dp_shard: int, opt: OptimizerConfig | None = None,
    replicate_frozen: bool = False, precision: str = "fp32",
) -> tuple[torch.nn.Module, StepRunner, CommCounter, list[str]]:  # fmt: skip
    """As the trainer builds a rank: meta model, freeze, shard on the mesh, fill from rank 0."""
    opt = opt or ADAMW
    source = build_init_source(FAMILY, TINY, seed=3) if rank == 0 else None
    model = meta_model(FAMILY, TINY)
    frozen = freeze_for_config(model, opt)
    groups = resolve_groups(model, opt)
    comm = CommCounter()
    if world > 1:
        mesh = build_mesh("cpu", world, dp_shard)
        train = TrainConfig(precision=precision)
        apply_fsdp(model, mesh, train, frozen if replicate_frozen else (), comm)
        materialize_from_rank0(model, source.state_dict() if source else None, torch.device("cpu"))
    else:
        model.load_state_dict(source.state_dict(), assign=True)
    optimizer = build_optimizer(model, groups, opt)
    scheduler = build_scheduler(optimizer, 10, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step, ids):
        return flow_noise_and_time(0, step, ids, (CHUNK, ACTION_DIM))

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)
    return model, runner, comm, frozen


def train(runner: StepRunner, rank: int, world: int, steps: range) -> list[float]:
    per_rank = GLOBAL_BATCH // world
    return [
        runner.run(step, [split(global_batch(step), rank * per_rank, per_rank)])["loss"]
        for step in steps
    ]


def save(
    directory, model, runner, rank: int, world: int, step: int, frozen
) -> tuple[CheckpointSaver, list]:
    """What the trainer's `_save` does, in the background: sidecars, then staged shards. Returns
    the saver, with the save in flight, and the list its completion appends to."""
    state = TrainState(
        step=step, epoch=0, sample_in_epoch=step * GLOBAL_BATCH, samples_seen=step * GLOBAL_BATCH,
        world_size=world, run_name="hsdp", config_hash="-", dataset_fingerprint="-",
    )  # fmt: skip
    spec = DataSpec({"observation.image": (3, 32, 32)}, state_dim=2, action_dim=2, chunk_size=8)
    write_sidecars(
        directory, runner.scheduler, state, rank, to_yaml(Config()),
        Normalizer.from_stats(STATS, "mean_std"),
        PolicyMeta("flow_vla", TINY, spec, ("reach the red disc",), (0.0, 0.0)),
    )  # fmt: skip
    saver = CheckpointSaver(background=True, device=torch.device("cpu"), optimizer=runner.optimizer)
    reported: list = []
    saver.save(
        directory, tensor_state(model, runner.optimizer, frozen), rank, lambda: reported.append(1)
    )
    assert saver.in_flight is not None and not reported  # the step loop goes on meanwhile
    assert saver.in_flight.staged is not None  # nothing has waited for the staging copy yet
    return saver, reported


def meshes(rank: int, world: int, ckpt_dir: str) -> dict:
    out: dict = {}
    # Same steps on HSDP 2x2 and on 1x4 (one shard group).
    for name, dp_shard in (("2x2", 2), ("1x4", 4)):
        model, runner, comm, _ = build(rank, world, dp_shard)
        out[f"loss/{name}"] = torch.tensor(train(runner, rank, world, range(STEPS)))
        out[f"comm/{name}"] = torch.tensor(list(comm.take().values()))
    # Save on 1x4 after 2 steps (in the background), then resume on 2x2 and on 4 flat.
    model, runner, _, frozen = build(rank, world, 4)
    train(runner, rank, world, range(STEPS - 1))
    saver, reported = save(Path(ckpt_dir), model, runner, rank, world, STEPS - 1, frozen)
    # The next step runs while the save is in flight; its optimizer step (which writes the
    # weights being copied) waits for the staging copy first. The resumes below match it only if
    # the checkpoint holds the weights from before that step.
    out["next/1x4"] = torch.tensor(train(runner, rank, world, range(STEPS - 1, STEPS)))
    assert saver.in_flight is None or saver.in_flight.staged is None
    saver.close()
    assert reported == [1]
    out["params/1x4"] = gather_full_state(model)
    for name, dp_shard in (("2x2", 2), ("flat4", 0)):
        model, runner, _, frozen = build(rank, world, dp_shard)
        state = load_checkpoint(
            Path(ckpt_dir), model, runner.optimizer, runner.scheduler, rank, world, frozen
        )
        assert state.step == STEPS - 1
        out[f"next/{name}"] = torch.tensor(train(runner, rank, world, range(STEPS - 1, STEPS)))
        out[f"params/{name}"] = gather_full_state(model)
    # Frozen weights: replicated (fp32 and bf16) against sharded, on HSDP 2x2.
    for precision in ("fp32", "bf16"):
        for replicate in (False, True):
            model, runner, comm, frozen = build(rank, world, 2, EXPERT_ONLY, replicate, precision)
            key = f"{precision}/{'replicated' if replicate else 'sharded'}"
            out[f"frozen_loss/{key}"] = torch.tensor(train(runner, rank, world, range(STEPS)))
            out[f"frozen_allgather/{key}"] = torch.tensor(comm.take()["comm/allgather_bytes"])
            params = dict(model.named_parameters())
            out[f"frozen_dtypes/{key}"] = sorted({str(params[n].dtype) for n in frozen})
            out[f"frozen_plain/{key}"] = all(not hasattr(params[n], "to_local") for n in frozen)
            out[f"in_optimizer/{key}"] = sum(
                p is params[n] for g in runner.optimizer.param_groups for p in g["params"]
                for n in frozen
            )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def reference() -> list[float]:
    _, runner, _, _ = build(0, 1, 0)
    return train(runner, 0, 1, range(STEPS))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("hsdp")
    program = functools.partial(meshes, ckpt_dir=str(tmp / "checkpoint"))
    return run_distributed(program, tmp, world=WORLD)


def test_mesh_shape_and_bad_shard_degree():
    assert mesh_shape(4, 0) == (1, 4) and mesh_shape(4, 2) == (2, 2) and mesh_shape(4, 1) == (4, 1)
    with pytest.raises(ValueError, match="train.dp_shard=3 does not divide the world size 4"):
        mesh_shape(4, 3)


def test_hsdp_2x2_and_1x4_match_one_process(four_ranks, reference):
    for name in ("2x2", "1x4"):
        torch.testing.assert_close(
            four_ranks[f"loss/{name}"], torch.tensor(reference), rtol=1e-5, atol=1e-6
        )
    # HSDP all-reduces each reduce-scattered shard across the 2 replicas; one shard group does not.
    assert len(four_ranks["comm/2x2"]) == 3 and len(four_ranks["comm/1x4"]) == 2


def test_checkpoint_saved_on_1x4_resumes_on_2x2_and_flat(four_ranks):
    expected = four_ranks["next/1x4"]
    for name in ("2x2", "flat4"):
        torch.testing.assert_close(four_ranks[f"next/{name}"], expected, rtol=1e-5, atol=1e-6)
        for key, value in four_ranks["params/1x4"].items():
            torch.testing.assert_close(
                four_ranks[f"params/{name}"][key], value, rtol=1e-5, atol=1e-6, msg=key
            )


def test_replicated_frozen_weights_match_sharded_and_are_never_gathered(four_ranks):
    for precision in ("fp32", "bf16"):
        sharded = four_ranks[f"frozen_loss/{precision}/sharded"]
        replicated = four_ranks[f"frozen_loss/{precision}/replicated"]
        torch.testing.assert_close(replicated, sharded, rtol=1e-5, atol=1e-6, msg=precision)
        assert four_ranks[f"frozen_plain/{precision}/replicated"]
        assert not four_ranks[f"frozen_plain/{precision}/sharded"]
        assert (
            four_ranks[f"frozen_allgather/{precision}/replicated"]
            < four_ranks[f"frozen_allgather/{precision}/sharded"]
        )
        assert four_ranks[f"in_optimizer/{precision}/replicated"] == 0
    assert four_ranks["frozen_dtypes/bf16/replicated"] == ["torch.bfloat16"]
    assert four_ranks["frozen_dtypes/fp32/replicated"] == ["torch.float32"]
    assert four_ranks["frozen_dtypes/bf16/sharded"] == ["torch.float32"]  # fp32 masters
