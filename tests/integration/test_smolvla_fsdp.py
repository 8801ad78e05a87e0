"""SmolVLA under FSDP2 on 2 gloo ranks (no Ray): the sharded loss equals the single-process one,
and bf16 mixed precision with activation checkpointing (per joint and vision layer) trains close
to it, with flow noise and time kept in fp32."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import torch
from _spawn import run_distributed
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _paths import fixtures_root  # noqa: E402

from raytrain_vla.common.normalize import Normalizer  # noqa: E402
from raytrain_vla.common.spec import DataSpec  # noqa: E402
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig  # noqa: E402
from raytrain_vla.models.registry import get_family  # noqa: E402
from raytrain_vla.models.smolvla.options import SmolVLAOptions  # noqa: E402
from raytrain_vla.train.fsdp import apply_fsdp  # noqa: E402
from raytrain_vla.train.init_source import build_init_source  # noqa: E402
from raytrain_vla.train.materialize import materialize_from_rank0, meta_model  # noqa: E402
from raytrain_vla.train.noise import flow_noise_and_time  # noqa: E402
from raytrain_vla.train.optim import (  # noqa: E402
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.step import StepRunner  # noqa: E402

SPEC = DataSpec({"cam": (3, 48, 64)}, state_dim=3, action_dim=2, chunk_size=10)
STATS = {
    "observation.state": {"mean": [0.0] * 3, "std": [1.0] * 3},
    "action": {"mean": [0.0, 0.0], "std": [0.5, 0.5]},
}
STEPS, BATCH = 3, 8


def columns(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = rng.normal(size=(n, 3)).astype(np.float32)
    return {
        "sample_id": np.arange(seed * n, (seed + 1) * n),
        "image/cam": rng.integers(0, 255, (n, 3, 48, 64)).astype(np.uint8),
        "state": state,
        "task": np.array(["pick the cube", "open it"] * (n // 2), dtype=object),
        "actions": np.repeat(0.4 * state[:, None, :2], 10, axis=1),
        "action_is_pad": np.zeros((n, 10), bool),
    }


def setup():
    family = get_family("smolvla")
    pretrained = str(fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model")
    options = SmolVLAOptions(cameras={"observation.images.front": "cam"})
    config = family.resolve_config(options, SPEC, pretrained)
    processor = family.processor(config, Normalizer.from_stats(STATS, "mean_std"))
    return family, config, processor, pretrained


def train(model, processor, rank: int, world: int) -> list[float]:
    optim_cfg = OptimizerConfig(lr=1e-3, groups=[])
    groups = resolve_groups(model, optim_cfg)
    optimizer = build_optimizer(model, groups, optim_cfg)
    scheduler = build_scheduler(optimizer, STEPS, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step: int, ids: list[int]):
        return flow_noise_and_time(0, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=10.0)
    per_rank, losses = BATCH // world, []
    for step in range(STEPS):
        encoded = processor.encode(columns(step, BATCH))
        mine = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in encoded.items()}
        losses.append(runner.run(step, [processor.collate(mine, "cpu")])["loss"])
    return losses


def dist_train(rank: int, world: int, precision: str) -> dict:
    family, config, processor, pretrained = setup()
    source = build_init_source(family, config, 0, pretrained) if rank == 0 else None
    model = meta_model(family, config)
    freeze_for_config(model, OptimizerConfig())
    if source is not None:
        freeze_for_config(source, OptimizerConfig())
    train_cfg = TrainConfig(precision=precision, activation_checkpointing=precision == "bf16")
    apply_fsdp(model, init_device_mesh("cpu", (world,)), train_cfg)
    materialize_from_rank0(model, source.state_dict() if source else None, torch.device("cpu"))
    return {"losses": torch.tensor(train(model, processor, rank, world))}


def test_sharded_fp32_matches_one_process_and_bf16_with_checkpointing_is_close(tmp_path):
    family, config, processor, pretrained = setup()
    single = build_init_source(family, config, 0, pretrained)
    freeze_for_config(single, OptimizerConfig())
    expected = torch.tensor(train(single, processor, 0, 1))
    fp32 = run_distributed(functools.partial(dist_train, precision="fp32"), tmp_path)["losses"]
    torch.testing.assert_close(fp32, expected, rtol=1e-4, atol=1e-5)
    bf16 = run_distributed(functools.partial(dist_train, precision="bf16"), tmp_path)["losses"]
    assert torch.isfinite(bf16).all()
    torch.testing.assert_close(bf16, expected, rtol=3e-2, atol=3e-2)
