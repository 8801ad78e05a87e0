"""The family contract is the only seam: a second family, defined in this file alone, trains
through StepRunner with FSDP2 on 2 gloo ranks (no Ray), is checkpointed, exported by the export
CLI and loaded with `policy.load`, and predicts there what the sharded model predicted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from _spawn import run_distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import register_fsdp_forward_method
from torch.distributed.tensor import DTensor

from raytrain_vla import export, policy
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import Config, to_yaml
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.models.base import ModelFamily, VLAModel
from raytrain_vla.models.processing import ImageStateProcessor
from raytrain_vla.models.registry import get_family, register_family
from raytrain_vla.policy.format import PolicyMeta
from raytrain_vla.train.checkpoint import save_checkpoint
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.init_source import build_init_source
from raytrain_vla.train.materialize import materialize_from_rank0, meta_model
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import build_optimizer, build_scheduler, resolve_groups
from raytrain_vla.train.step import StepRunner
from raytrain_vla.train.train_state import TrainState

# -- the toy family: an MLP policy, a few lines per contract piece ------------------------------


@dataclass(frozen=True)
class ToyConfig:
    camera_keys: tuple[str, ...]
    image_size: tuple[int, int]
    state_dim: int
    action_dim: int
    chunk_size: int
    hidden: int = 32

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToyConfig:
        return cls(
            **{**d, "camera_keys": tuple(d["camera_keys"]), "image_size": tuple(d["image_size"])}
        )


class ToyPolicy(VLAModel):
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "vision": ("eye.",), "backbone": ("trunk.",), "action_expert": ("head.",)
    }  # fmt: skip

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config, h, w = config, *config.image_size
        cam = 3 * h * w * len(config.camera_keys)
        self.eye = nn.Linear(cam + config.state_dim, config.hidden)
        self.trunk = nn.ModuleList(nn.Linear(config.hidden, config.hidden) for _ in range(2))
        flat = config.chunk_size * config.action_dim
        self.head = nn.Sequential(
            nn.Linear(config.hidden + flat + 1, config.hidden), nn.GELU(),
            nn.Linear(config.hidden, flat),
        )  # fmt: skip

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.action_dim

    def fsdp_units(self) -> list[nn.Module]:
        return [self.eye, *self.trunk]

    def _context(self, batch: dict) -> torch.Tensor:
        images = [batch["images"][k].flatten(1) for k in self.config.camera_keys]
        x = torch.tanh(self.eye(torch.cat([*images, batch["state"]], 1)))
        for block in self.trunk:
            x = x + torch.tanh(block(x))
        return x

    def _velocity(self, context, x_t, time) -> torch.Tensor:
        return self.head(torch.cat([context, x_t.flatten(1), time[:, None]], 1)).view_as(x_t)

    def forward(self, batch: dict, noise: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        actions, t = batch["actions"], time[:, None, None]
        v = self._velocity(self._context(batch), t * noise + (1 - t) * actions, time)
        valid = (~batch["action_is_pad"]).float()
        return ((v - (noise - actions)).square().mean(-1) * valid).sum(1) / valid.sum(1)

    @torch.no_grad()
    def sample_actions(self, batch: dict, noise: torch.Tensor) -> torch.Tensor:
        context, x = self._context(batch), noise
        for i in range(4):
            x = x - 0.25 * self._velocity(context, x, torch.full((len(x),), 1 - i / 4))
        return x


class ToyFamily(ModelFamily):
    name, config_type, model_type = "toy_mlp", ToyConfig, ToyPolicy

    def resolve_config(self, options: Any, spec: DataSpec) -> ToyConfig:
        return ToyConfig(
            tuple(spec.camera_keys), spec.image_size or (8, 8), spec.state_dim, spec.action_dim,
            spec.chunk_size,
        )  # fmt: skip

    def processor(self, config: ToyConfig, normalizer: Normalizer) -> ImageStateProcessor:
        return ImageStateProcessor(
            list(config.camera_keys), config.image_size, config.state_dim, config.action_dim,
            normalizer,
        )  # fmt: skip


register_family(ToyFamily())  # at import, so spawned ranks (which re-import this file) have it

# -- a run of it ---------------------------------------------------------------------------------

SPEC = DataSpec({"cam": (3, 12, 12)}, state_dim=3, action_dim=2, chunk_size=4, image_size=(8, 8))
STATS = {
    "observation.state": {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
    "action": {"mean": [0.0, 0.0], "std": [0.5, 0.5]},
}
GLOBAL_BATCH, STEPS = 16, 80


def columns(seed: int, n: int) -> dict[str, np.ndarray]:
    """Raw dataset columns: the action chunk is a function of the state (learnable)."""
    rng = np.random.default_rng(seed)
    state = rng.normal(size=(n, 3)).astype(np.float32)
    actions = np.repeat(0.4 * state[:, None, :2], 4, axis=1).astype(np.float32)
    pad = np.zeros((n, 4), bool)
    pad[0, 2:] = True
    return {
        "sample_id": np.arange(seed * n, (seed + 1) * n),
        "image/cam": np.full((n, 3, 12, 12), 40 * (seed % 4), np.uint8),
        "state": state,
        "task": np.array(["move"] * n, dtype=object),
        "actions": actions,
        "action_is_pad": pad,
    }


def observation() -> dict:
    cols = columns(99, 1)
    return {
        "cam": cols["image/cam"][0].transpose(1, 2, 0),  # HWC uint8, as a camera gives it
        "state": cols["state"][0],
        "instruction": "move",
    }


def dist_train_toy(rank: int, world: int, checkpoint_dir: str) -> dict:
    family = get_family("toy_mlp")
    config = family.resolve_config(None, SPEC)
    normalizer = Normalizer.from_stats(STATS, "mean_std")
    processor = family.processor(config, normalizer)
    source = build_init_source(family, config, seed=0) if rank == 0 else None
    model = meta_model(family, config)
    optim_cfg = OptimizerConfig(lr=1e-2, groups=[])  # one group: every role at 1e-2
    groups = resolve_groups(model, optim_cfg)
    apply_fsdp(model, init_device_mesh("cpu", (world,)), TrainConfig())
    materialize_from_rank0(model, source.state_dict() if source else None, torch.device("cpu"))
    register_fsdp_forward_method(model, "sample_actions")
    optimizer = build_optimizer(model, groups, optim_cfg)
    scheduler = build_scheduler(optimizer, STEPS, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step: int, ids: list[int]):
        return flow_noise_and_time(0, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)
    per_rank, losses = GLOBAL_BATCH // world, []

    def action_error() -> float:
        """Sampled vs true actions of held-out samples (model space), all ranks together."""
        held_out = processor.collate(processor.encode(columns(50, 16)), "cpu")
        noise, _ = flow_noise_and_time(1, 0, list(range(16)), model.noise_shape)
        return float((model.sample_actions(held_out, noise) - held_out["actions"]).square().mean())

    error_before = action_error()
    for step in range(STEPS):
        encoded = processor.encode(columns(step % 4, GLOBAL_BATCH))
        mine = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in encoded.items()}
        losses.append(runner.run(step, [processor.collate(mine, "cpu")])["loss"])
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    error_after = action_error()
    state = TrainState(
        step=STEPS, epoch=0, sample_in_epoch=0, samples_seen=STEPS * GLOBAL_BATCH,
        world_size=world, run_name="toy", config_hash="-", dataset_fingerprint="-",
    )  # fmt: skip
    meta = PolicyMeta(family.name, config, SPEC, ("move",), (0.0, 0.0))
    save_checkpoint(
        Path(checkpoint_dir), model, optimizer, scheduler, state, rank, to_yaml(Config()), normalizer,
        meta,
    )  # fmt: skip
    # What the sharded model predicts for one observation, with a policy's first noise draw.
    obs = observation()
    cols = {"image/cam": obs["cam"].transpose(2, 0, 1)[None], "state": obs["state"][None]}
    batch = processor.collate(processor.encode({**cols, "task": np.array(["move"])}), "cpu")
    noise = torch.randn((1, *model.noise_shape), generator=torch.Generator().manual_seed(0))
    predicted = processor.decode_actions(model.sample_actions(batch, noise))[0]
    return {
        "losses": torch.tensor(losses),
        "action_error": torch.tensor([error_before, error_after]),
        "predicted": predicted,
        "sharded": torch.tensor(sharded),
    }


def test_a_family_defined_here_trains_sharded_exports_and_loads_as_a_policy(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    result = run_distributed(
        functools.partial(dist_train_toy, checkpoint_dir=str(checkpoint)), tmp_path
    )
    assert bool(result["sharded"])
    assert torch.isfinite(result["losses"]).all()
    before, after = result["action_error"].tolist()
    assert after < 0.5 * before, (before, after)  # it learned the state -> action map

    meta = json.loads((checkpoint / "policy.json").read_text())
    assert meta["model_type"] == "toy_mlp" and meta["model_config"]["hidden"] == 32
    assert export.main([str(checkpoint), str(tmp_path / "toy_policy")]) == 0
    loaded = policy.load(tmp_path / "toy_policy", seed=0)
    assert isinstance(loaded.model, ToyPolicy) and loaded.camera_keys == ["cam"]
    chunk = loaded.predict_action(observation())
    assert chunk.shape == (4, 2)
    np.testing.assert_allclose(chunk, result["predicted"].numpy(), rtol=1e-5, atol=1e-6)
