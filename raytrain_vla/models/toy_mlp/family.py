"""The toy_mlp family: a state-and-pixels MLP trained by flow matching, behind the contract.

Each camera is average-pooled to `pool` x `pool`, concatenated with the normalised state and
encoded by two residual MLP blocks (the FSDP units); a head predicts the flow velocity of the
action chunk from that context, the noisy chunk and the flow time. It has no language input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.base import (
    ACTION_EXPERT,
    BACKBONE,
    VISION,
    ModelFamily,
    VLAModel,
    config_to_dict,
    known_fields,
)
from raytrain_vla.models.processing import ImageStateProcessor
from raytrain_vla.models.toy_mlp.options import ToyMLPOptions


@dataclass(frozen=True)
class ToyMLPConfig:
    camera_keys: tuple[str, ...]
    image_size: tuple[int, int]
    state_dim: int
    action_dim: int
    chunk_size: int
    hidden: int = 64
    pool: int = 8
    num_inference_steps: int = 4

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToyMLPConfig:
        data = known_fields(cls, data)
        data["camera_keys"] = tuple(data["camera_keys"])
        data["image_size"] = tuple(int(v) for v in data["image_size"])
        return cls(**data)


class ToyMLP(VLAModel):
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        VISION: ("eye.",), BACKBONE: ("trunk.",), ACTION_EXPERT: ("head.",)
    }  # fmt: skip

    def __init__(self, config: ToyMLPConfig):
        super().__init__()
        self.config = config
        pixels = 3 * config.pool * config.pool * len(config.camera_keys)
        self.eye = nn.Linear(pixels + config.state_dim, config.hidden)
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
        return [self.eye, *self.trunk, self.head]

    def _context(self, batch: dict[str, Any]) -> torch.Tensor:
        pool = self.config.pool
        pixels = [
            F.adaptive_avg_pool2d(batch["images"][k].float(), pool).flatten(1)
            for k in self.config.camera_keys
        ]
        x = torch.tanh(self.eye(torch.cat([*pixels, batch["state"].float()], 1)))
        for block in self.trunk:
            x = x + torch.tanh(block(x))
        return x

    def _velocity(self, context: torch.Tensor, x_t: torch.Tensor, time: torch.Tensor):
        return self.head(torch.cat([context, x_t.flatten(1), time[:, None]], 1)).view_as(x_t)

    def forward(self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor):
        actions, t = batch["actions"], time[:, None, None]
        velocity = self._velocity(self._context(batch), t * noise + (1 - t) * actions, time)
        valid = (~batch["action_is_pad"]).float()
        error = (velocity - (noise - actions)).square().mean(-1)
        return (error * valid).sum(1) / valid.sum(1).clamp(min=1.0)

    @torch.no_grad()
    def sample_actions(self, batch: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        context, x, steps = self._context(batch), noise, self.config.num_inference_steps
        for i in range(steps):
            time = torch.full((len(x),), 1 - i / steps, device=x.device)
            x = x - self._velocity(context, x, time) / steps
        return x


class ToyMLPFamily(ModelFamily):
    name = "toy_mlp"
    options_type = ToyMLPOptions
    config_type = ToyMLPConfig
    model_type = ToyMLP

    def resolve_config(
        self, options: ToyMLPOptions, spec: DataSpec, init_from: str = "", lora: Any = None
    ) -> ToyMLPConfig:
        """Cameras at `data.image_size`, else at the first camera's resolution."""
        image_size = spec.image_size or spec.camera_shapes[spec.camera_keys[0]][1:]
        return ToyMLPConfig(
            tuple(spec.camera_keys), tuple(image_size), spec.state_dim, spec.action_dim,
            spec.chunk_size, options.hidden, options.pool, options.num_inference_steps,
        )  # fmt: skip

    def processor(self, config: ToyMLPConfig, normalizer: Normalizer) -> ImageStateProcessor:
        return ImageStateProcessor(
            list(config.camera_keys), config.image_size, config.state_dim, config.action_dim,
            normalizer,
        )  # fmt: skip

    def tiny_options(self, fixtures: Path | None) -> ToyMLPOptions:
        return ToyMLPOptions(hidden=16, pool=4)


FAMILY = ToyMLPFamily()
