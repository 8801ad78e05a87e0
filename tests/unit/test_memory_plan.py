"""`plan-memory`: per-rank bytes from the meta model (state by shard group, frozen placement,
gathered units), activations counted from what autograd saves, and the CLI's answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from _paths import fixtures_root
from torch import nn

from raytrain_vla import plan_memory
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.schema import OptimizerConfig, TrainConfig
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.models.base import BACKBONE, VLAModel
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.memory_plan import (
    GB,
    Activations,
    example_micro_batch,
    measure_activations,
    plan,
    shard_numel,
)
from raytrain_vla.train.muon import muon_parameter_names
from raytrain_vla.train.optim import freeze_for_config

SPEC = DataSpec({"observation.image": (3, 32, 32)}, state_dim=2, action_dim=2, chunk_size=8)
FAMILY = get_family("flow_vla")
CONFIG = FAMILY.config_type.from_size("tiny")
ACTS = Activations(micro_batch=4, plain=1000, checkpointed=400, measured_on="meta")
W = 8  # the chain's width


class Chain(VLAModel):
    """`depth` blocks of Linear-tanh-Linear-tanh on the action vector: each block saves its
    input, its hidden tanh output and its output (the next block's input), nothing else."""

    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {BACKBONE: ("blocks.",)}

    def __init__(self, depth: int = 3, data_dependent: bool = False):
        super().__init__()
        self.data_dependent = data_dependent
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(W, W, bias=False), nn.Tanh(), nn.Linear(W, W, bias=False), nn.Tanh()
            )
            for _ in range(depth)
        )

    @property
    def noise_shape(self) -> tuple[int, int]:
        return 1, W

    def fsdp_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward(self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor):
        x = batch["actions"].flatten(1)
        if self.data_dependent:  # needs values: fails on meta
            x = x[:, : int(batch["sample_ids"].max()) * 0 + W]
        for block in self.blocks:
            x = block(x)
        return x.square().mean(1)

    def sample_actions(self, batch: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        return noise


def chain_batch(n: int) -> dict:
    return {"actions": torch.zeros(n, 1, W), "sample_ids": torch.arange(n)}


def meta_chain(**kwargs: Any) -> Chain:
    with torch.device("meta"):
        return Chain(**kwargs)


def tiny(freeze_roles: tuple[str, ...] = ()) -> tuple[VLAModel, list[str]]:
    with torch.device("meta"):
        model = FAMILY.build(FAMILY.resolve_config(FAMILY.options_type(), SPEC))
    return model, freeze_for_config(model, OptimizerConfig(freeze_roles=list(freeze_roles)))


def numel(model: nn.Module, names: list[str] | None = None) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if names is None or n in set(names))


# --- state --------------------------------------------------------------------------------------


def test_state_bytes_add_up_from_the_meta_model():
    model, frozen = tiny()
    n = numel(model)
    p = plan(model, frozen, TrainConfig(), 1, ACTS)
    assert (p.replicate, p.shard, p.frozen_placement) == (1, 1, "none")
    assert (p.params, p.grads, p.optimizer, p.frozen) == (4 * n, 4 * n, 8 * n, 0)
    peak = max(p.gathered + ACTS.plain, p.step_transient)
    assert p.total == p.params + p.grads + p.optimizer + peak
    assert 0 < p.step_transient <= p.params and p.gathered > 0


def test_muon_matrices_keep_one_state_adamw_parameters_two():
    model, frozen = tiny()
    n = numel(model)
    muon = muon_parameter_names(model, OptimizerConfig().muon.exclude_patterns)
    m = numel(model, sorted(muon))
    assert 0 < m < n
    adamw = plan(model, frozen, TrainConfig(), 1, ACTS)
    mixed = plan(model, frozen, TrainConfig(), 1, ACTS, muon=muon)
    assert (adamw.optimizer, mixed.optimizer) == (8 * n, 8 * (n - m) + 4 * m)
    assert adamw.total - mixed.total == 4 * m


def test_fsdp2_shards_pad_dim_0_to_the_shard_group():
    assert shard_numel(torch.empty(5, 3, device="meta"), 4) == 2 * 3
    assert shard_numel(torch.empty(8, 3, device="meta"), 4) == 2 * 3
    assert shard_numel(torch.empty((), device="meta"), 4) == 1


def test_dp_shard_sets_the_divisor_and_replicas_keep_their_own_copy():
    model, frozen = tiny()
    flat4 = plan(model, frozen, TrainConfig(), 4, ACTS)
    flat2 = plan(model, frozen, TrainConfig(), 2, ACTS)
    hsdp4 = plan(model, frozen, TrainConfig(dp_shard=2), 4, ACTS)
    assert (flat4.replicate, flat4.shard, hsdp4.replicate, hsdp4.shard) == (1, 4, 2, 2)
    assert hsdp4.params == flat2.params and hsdp4.optimizer == flat2.optimizer
    assert flat4.params < flat2.params
    expected = sum(4 * shard_numel(p, 4) for p in model.parameters())
    assert flat4.params == expected >= 4 * numel(model) / 4


def test_frozen_weights_replicate_in_the_compute_dtype_or_shard_in_fp32():
    model, frozen = tiny(freeze_roles=("vision",))
    n_frozen = numel(model, frozen)
    assert 0 < n_frozen < numel(model)
    rep = plan(model, frozen, TrainConfig(frozen_params="replicate"), 4, ACTS)
    rep16 = plan(model, frozen, TrainConfig(frozen_params="replicate", precision="bf16"), 4, ACTS)
    shard = plan(model, frozen, TrainConfig(frozen_params="shard"), 4, ACTS)
    assert rep.frozen == 4 * n_frozen and rep16.frozen == 2 * n_frozen  # bf16 halves it
    params = dict(model.named_parameters())
    assert shard.frozen == sum(4 * shard_numel(params[n], 4) for n in frozen) < rep.frozen
    # Frozen parameters are neither trained nor in the optimizer...
    assert rep.params == 4 * sum(shard_numel(params[n], 4) for n in params if n not in frozen)
    assert rep.optimizer == 2 * rep.params
    # ...and FSDP2 gathers them only when it shards them (vision is one of the units).
    kept = {"reshard_after_forward": False}  # every unit counts, not just the largest
    rep_kept = plan(model, frozen, TrainConfig(frozen_params="replicate", **kept), 4, ACTS)
    shard_kept = plan(model, frozen, TrainConfig(frozen_params="shard", **kept), 4, ACTS)
    assert shard_kept.gathered - rep_kept.gathered == 4 * n_frozen


def test_auto_places_frozen_weights_by_the_gpu_memory_it_is_given():
    model, frozen = tiny(freeze_roles=("vision",))
    copy = 4 * numel(model, frozen)
    roomy = plan(model, frozen, TrainConfig(), 2, ACTS, gpu_memory_gb=80)
    tight = plan(model, frozen, TrainConfig(), 2, ACTS, gpu_memory_gb=copy / GB)
    assert (roomy.frozen_placement, tight.frozen_placement) == ("replicate", "shard")


def test_gathered_units_follow_reshard_after_forward_and_precision():
    model = meta_chain(depth=3)
    unit = 2 * W * W  # each block's two matrices
    kept = plan(model, [], TrainConfig(reshard_after_forward=False), 2, ACTS)
    resharded = plan(model, [], TrainConfig(reshard_after_forward=True), 2, ACTS)
    bf16 = plan(model, [], TrainConfig(reshard_after_forward=True, precision="bf16"), 2, ACTS)
    grad = unit * (4 + 4)  # the unsharded gradient and the fp32 reduce-scatter input
    assert kept.gathered == 3 * unit * 4 + grad
    assert resharded.gathered == 2 * unit * 4 + grad  # the unit computing and the prefetched
    assert bf16.gathered == 2 * unit * 2 + unit * (2 + 4)


def test_activation_checkpointing_and_offload_choose_what_counts():
    model, frozen = tiny()
    plain = plan(model, frozen, TrainConfig(), 2, ACTS)
    ac = plan(model, frozen, TrainConfig(activation_checkpointing=True), 2, ACTS)
    assert (plain.activations, ac.activations) == (ACTS.plain, ACTS.checkpointed)
    off = plan(model, frozen, TrainConfig(cpu_offload=True), 2, ACTS)
    assert off.total == off.gathered + ACTS.plain
    assert off.host == off.params + off.grads + off.optimizer + off.step_transient


def test_fits_flips_at_the_gpu_memory_given():
    model, frozen = tiny()
    total = plan(model, frozen, TrainConfig(), 2, ACTS).total
    assert plan(model, frozen, TrainConfig(), 2, ACTS, gpu_memory_gb=total * 1.01 / GB).fits
    assert not plan(model, frozen, TrainConfig(), 2, ACTS, gpu_memory_gb=total * 0.99 / GB).fits


# --- activations --------------------------------------------------------------------------------


def test_activations_are_the_storages_autograd_saves_once_each():
    """3 blocks: the input, each block's hidden and output; with checkpointing the blocks'
    inputs, the last output and one block's hidden while it is recomputed."""
    n, row = 5, W * 4
    acts = measure_activations(meta_chain(depth=3), chain_batch(n), "fp32", n)
    assert acts.measured_on == "meta"
    assert acts.plain == (1 + 2 * 3) * n * row
    assert acts.checkpointed == (1 + 3 + 1) * n * row < acts.plain


def test_bf16_halves_the_activations():
    n = 5
    fp32 = measure_activations(meta_chain(), chain_batch(n), "fp32", n)
    bf16 = measure_activations(meta_chain(), chain_batch(n), "bf16", n)
    assert bf16.plain * 2 == fp32.plain and bf16.checkpointed * 2 == fp32.checkpointed


def test_a_forward_that_needs_values_is_counted_on_cpu_and_scaled():
    n = 6
    meta = measure_activations(meta_chain(), chain_batch(n), "fp32", n)
    model = meta_chain(data_dependent=True)
    cpu = measure_activations(model, chain_batch(n), "fp32", n)
    assert cpu.measured_on == "cpu"
    assert (cpu.plain, cpu.checkpointed) == (meta.plain, meta.checkpointed)
    assert next(model.parameters()).device.type == "meta"  # the caller's model is untouched


def test_frozen_weights_save_less_and_the_tiny_model_counts():
    """flow_vla needs values (it trims text padding): counted on CPU, linear in the batch."""
    stats = {"observation.state": {"mean": [0, 0], "std": [1, 1]}}
    stats["action"] = stats["observation.state"]
    processor = FAMILY.processor(CONFIG, Normalizer.from_stats(stats, "mean_std"))
    tasks = ["reach the red disc", "go"]
    model, frozen = tiny()

    def count(size: int, m: VLAModel = model) -> Activations:
        return measure_activations(
            m, example_micro_batch(processor, SPEC, tasks, size), "fp32", size
        )

    one, two, four = count(1), count(2), count(4)
    assert two.measured_on == "cpu" and 0 < two.checkpointed < two.plain
    assert four.plain - two.plain == 2 * (two.plain - one.plain) > 0
    expert_only, _ = tiny(freeze_roles=("vision", "backbone"))
    assert count(2, expert_only).plain < two.plain


# --- the command --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("plan") / "demo", 12, 0)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = plan_memory.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_command_prints_a_table_per_world_size_and_whether_it_fits(demo, capsys):
    code, out, _ = run(capsys, f"--data.root={demo}", "--ray.num_workers=[1,2]")
    assert code == 0
    assert "world size 1: mesh 1 x 1 (replicate x shard)" in out
    assert "world size 2: mesh 1 x 2 (replicate x shard)" in out
    assert out.count("fits in 80 GB: yes (total ") == 2
    code, out, _ = run(capsys, f"--data.root={demo}", "--gpu-memory-gb", "0.0001")
    assert code == 0 and "fits in 0.0001 GB: no (total " in out


def test_json_output_and_overrides_work_as_for_train(demo, capsys):
    args = [f"--data.root={demo}", "--json", "--world-sizes", "2,4"]
    code, out, _ = run(capsys, *args, "--train.dp_shard=2", "--train.global_batch_size=128")
    assert code == 0
    result = json.loads(out)
    assert [(p["world_size"], p["replicate"], p["shard"]) for p in result["plans"]] == [
        (2, 1, 2),
        (4, 2, 2),
    ]
    first = result["plans"][0]
    assert first["total"] == (
        first["params"] + first["grads"] + first["optimizer"] + first["frozen"]
        + max(first["gathered"] + first["activations"], first["step_transient"])
    )  # fmt: skip
    assert result["activations"]["micro_batch"] == 32 and result["gpu_memory_gb"] == 80


def test_optimizer_type_muon_counts_its_one_buffer(demo, capsys):
    args = [f"--data.root={demo}", "--json", "--world-sizes", "1"]
    _, adamw, _ = run(capsys, *args)
    _, muon, _ = run(capsys, *args, "--optimizer.type=muon")
    adamw_plan, muon_plan = json.loads(adamw)["plans"][0], json.loads(muon)["plans"][0]
    assert adamw_plan["params"] == muon_plan["params"]
    assert adamw_plan["optimizer"] == 2 * adamw_plan["params"]
    assert adamw_plan["params"] < muon_plan["optimizer"] < adamw_plan["optimizer"]


def test_wall_x_is_planned_with_its_frozen_last_vlm_expert(demo, capsys):
    """Wall-OSS's vision tower needs real grid values, so its activations are counted on CPU;
    the last layer's VLM expert gets no gradient (only action rows leave the model)."""
    base = fixtures_root() / "lerobot_wallx_tiny" / "base"
    args = [f"--data.root={demo}", "--model.type=wall_x", f"--model.wall_x.base_path={base}"]
    code, out, _ = run(capsys, *args, "--json", "--world-sizes", "1,2",
                       "--train.micro_batch_size=2")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["model_type"] == "wall_x" and result["params"] == 268_640  # LeRobot's count
    assert result["frozen"] > 0 and result["activations"]["measured_on"] == "cpu"
    one, two = result["plans"]
    assert two["params"] * 2 == one["params"] and two["total"] < one["total"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--train.stepz=3"], "unknown key 'train.stepz'"),
        (["--world-sizes", "0"], "--world-sizes"),
        (["--gpu-memory-gb", "-1"], "--gpu-memory-gb"),
        (["--train.dp_shard=2", "--world-sizes", "2,3"], "world size 3"),
    ],
)
def test_errors_are_one_line_and_exit_2(demo, capsys, args, words):
    code, out, err = run(capsys, f"--data.root={demo}", *args)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]
