"""flow_vla: a pi0-style vision-language-action policy built from scratch (no weight downloads).

Vision: per camera a CoordConv CNN stem whose every conv is FiLM'd by the instruction (RT-1).
Backbone: a transformer over the prefix [image tokens, text tokens, state token].
Action expert: a transformer over the noisy action chunk + flow time, cross-attending to the
prefix, trained with flow matching (x_t = t*noise + (1-t)*a, target noise - a).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raytrain_vla.models.layers import (
    MLP,
    FiLMConvStem,
    TransformerBlock,
    conv_out_size,
    init_linear,
    masked_max,
    masked_mean,
    sinusoidal_embedding,
)
from raytrain_vla.models.registry import register_model
from raytrain_vla.models.tokenizer import VOCAB_SIZE

# Dims each size fills. tiny: CPU tests/demo (<1M); small: CPU overhead benchmark; base: GPUs.
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, num_heads=2, backbone_layers=2, expert_d_model=64,
                 expert_heads=2, expert_layers=2, vision_channels=(32, 32, 32),
                 vision_strides=(2, 2, 2), film_dim=64),
    "small": dict(d_model=384, num_heads=6, backbone_layers=8, expert_d_model=384,
                  expert_heads=6, expert_layers=6, vision_channels=(64, 128, 256),
                  vision_strides=(2, 2, 2), film_dim=256),
    "base": dict(d_model=2048, num_heads=16, backbone_layers=16, expert_d_model=1024,
                 expert_heads=16, expert_layers=12, vision_channels=(128, 256, 512, 768),
                 vision_strides=(2, 2, 2, 2), film_dim=1024),
}  # fmt: skip


@dataclass
class FlowVLAConfig:
    camera_keys: list[str] = field(default_factory=lambda: ["observation.image"])
    image_size: tuple[int, int] = (32, 32)
    state_dim: int = 2
    action_dim: int = 2
    chunk_size: int = 8
    size: str = "tiny"
    d_model: int = 64
    num_heads: int = 2
    backbone_layers: int = 2
    expert_d_model: int = 64
    expert_heads: int = 2
    expert_layers: int = 2
    mlp_ratio: float = 4.0
    vision_channels: tuple[int, ...] = (32, 32, 32)
    vision_strides: tuple[int, ...] = (2, 2, 2)
    film_dim: int = 64
    max_text_len: int = 48
    num_inference_steps: int = 10

    @classmethod
    def from_size(cls, size: str, **kwargs: Any) -> FlowVLAConfig:
        """Preset dims for ``size``; kwargs give the data shapes (and may override any dim)."""
        if size not in SIZE_PRESETS:
            raise ValueError(f"unknown flow_vla size {size!r}; known: {sorted(SIZE_PRESETS)}")
        return cls.from_dict({**SIZE_PRESETS[size], **kwargs, "size": size})

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples become lists), as written to an export's config.json."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlowVLAConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown FlowVLAConfig keys {unknown}; valid keys: {sorted(names)}")
        d = dict(d)
        for key in ("image_size", "vision_channels", "vision_strides"):
            if key in d:
                d[key] = tuple(int(v) for v in d[key])
        if "camera_keys" in d:
            d["camera_keys"] = list(d["camera_keys"])
        return cls(**d)


class FiLMVision(nn.Module):
    """All cameras' FiLM'd CoordConv stems: one module, hence one FSDP unit."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        self.camera_keys = list(cfg.camera_keys)
        # Byte n-gram detector, max-pooled: a colour word anywhere in the text lights a feature.
        self.text_pool = nn.Conv1d(cfg.d_model, cfg.film_dim, kernel_size=3, padding=1)
        self.text_norm = nn.LayerNorm(cfg.film_dim)  # unit-scale FiLM input from the start
        self.stems = nn.ModuleList(
            FiLMConvStem(cfg.vision_channels, cfg.vision_strides, cfg.film_dim)
            for _ in self.camera_keys
        )
        h, w = cfg.image_size
        for stride in cfg.vision_strides:
            h, w = conv_out_size(h, stride), conv_out_size(w, stride)
        self.tokens_per_camera = h * w
        self.proj = nn.Linear(cfg.vision_channels[-1], cfg.d_model)
        self.pos = nn.Parameter(torch.empty(len(self.camera_keys), h * w, cfg.d_model))

    def init_weights(self) -> None:
        self.text_pool.reset_parameters()
        self.text_norm.reset_parameters()
        for stem in self.stems:
            stem.init_weights()
        init_linear(self.proj)
        nn.init.normal_(self.pos, std=0.1)

    def forward(
        self, images: dict[str, torch.Tensor], text_emb: torch.Tensor, text_mask: torch.Tensor
    ) -> torch.Tensor:
        """images: key -> (B, 3, H, W) in [0, 1]; text_emb (B, L, D) -> tokens (B, N, D)."""
        # Zero the padding first: the n-gram conv then sees the same zeros past the text whether
        # or not padding columns were trimmed, so a sample's output never depends on its batch.
        text_emb = text_emb * text_mask.unsqueeze(-1).to(text_emb.dtype)
        pooled = F.gelu(self.text_pool(text_emb.transpose(1, 2))).transpose(1, 2)
        cond = self.text_norm(masked_max(pooled, text_mask, dim=1))
        out = []
        for i, (key, stem) in enumerate(zip(self.camera_keys, self.stems, strict=True)):
            x = stem(images[key], cond)
            out.append(self.proj(x.flatten(2).transpose(1, 2)) + self.pos[i])
        return torch.cat(out, dim=1)


class Backbone(nn.Module):
    """Text/state embeddings plus the prefix transformer (its blocks are the FSDP units)."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        d = cfg.d_model
        self.text_embed = nn.Embedding(VOCAB_SIZE, d)
        self.text_pos = nn.Parameter(torch.empty(cfg.max_text_len, d))
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, cfg.num_heads, cfg.mlp_ratio) for _ in range(cfg.backbone_layers)
        )
        self.norm = nn.LayerNorm(d)

    def init_weights(self) -> None:
        nn.init.normal_(self.text_embed.weight, std=1.0)
        nn.init.normal_(self.text_pos, std=0.1)
        init_linear(self.state_proj)
        for block in self.blocks:
            block.init_weights()
        self.norm.reset_parameters()

    def forward(
        self, image_tokens: torch.Tensor, text_emb: torch.Tensor, text_mask: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        text = text_emb + self.text_pos[: text_emb.shape[1]]
        x = torch.cat([image_tokens, text, self.state_proj(state)[:, None]], dim=1)
        ones = text_mask.new_ones(x.shape[0], image_tokens.shape[1])
        mask = torch.cat([ones, text_mask, ones[:, :1]], dim=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x), mask


class ActionExpert(nn.Module):
    """Denoiser over the action chunk; cross-attends to the prefix computed once per sample."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        d = cfg.expert_d_model
        self.action_in = nn.Linear(cfg.action_dim, d)
        self.time_mlp = MLP(2 * d, d, d)  # pi0's action_time_mlp over concat(action, time)
        self.pos = nn.Parameter(torch.empty(cfg.chunk_size, d))
        self.blocks = nn.ModuleList(
            TransformerBlock(d, cfg.expert_heads, cfg.mlp_ratio, context_dim=cfg.d_model)
            for _ in range(cfg.expert_layers)
        )
        self.norm = nn.LayerNorm(d)
        self.action_out = nn.Linear(d, cfg.action_dim)

    def init_weights(self) -> None:
        init_linear(self.action_in)
        self.time_mlp.init_weights()
        nn.init.normal_(self.pos, std=0.1)
        for block in self.blocks:
            block.init_weights()
        self.norm.reset_parameters()
        init_linear(self.action_out)

    def forward(
        self, x_t: torch.Tensor, time: torch.Tensor, prefix: torch.Tensor,
        prefix_mask: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Velocity at every chunk position, all positions seeing each other.

        No mask over padded positions: inference cannot know where the episode ends, so
        training must not either (hiding them made near-end chunks 9x worse, docs/architecture).
        """
        a = self.action_in(x_t)
        t = sinusoidal_embedding(time, a.shape[-1]).to(a.dtype)[:, None].expand_as(a)
        x = self.time_mlp(torch.cat([a, t], dim=-1)) + self.pos
        for block in self.blocks:
            x = block(x, context=prefix, context_mask=prefix_mask)
        return self.action_out(self.norm(x))


class FlowVLA(nn.Module):
    """Children ``vision``, ``backbone`` and ``action_expert`` partition all parameters."""

    def __init__(self, config: FlowVLAConfig):
        super().__init__()
        self.config = config
        self.vision = FiLMVision(config)
        self.backbone = Backbone(config)
        self.action_expert = ActionExpert(config)
        self.init_weights()

    def init_weights(self) -> None:
        """(Re)initialise every parameter; call after ``to_empty`` when built on meta."""
        with torch.no_grad():
            self.vision.init_weights()
            self.backbone.init_weights()
            self.action_expert.init_weights()

    def transformer_blocks(self) -> list[nn.Module]:
        """Per-block FSDP / activation-checkpointing units, backbone first."""
        return [*self.backbone.blocks, *self.action_expert.blocks]

    def embed_prefix(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask = obs["text_tokens"], obs["text_mask"]
        # Drop all-padding columns: text is right-padded and masked, so outputs are unchanged,
        # but short instructions in a long max_text_len no longer cost attention time.
        keep = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else 1
        if keep > self.config.max_text_len:
            raise ValueError(
                f"text_tokens hold {keep} tokens but max_text_len is {self.config.max_text_len}; "
                "tokenize with the model's max_text_len"
            )
        tokens, mask = tokens[:, :keep], mask[:, :keep]
        text_emb = self.backbone.text_embed(tokens)
        image_tokens = self.vision(obs["images"], text_emb, mask)
        return self.backbone(image_tokens, text_emb, mask, obs["state"].to(text_emb.dtype))

    def compute_dtype(self) -> torch.dtype:
        """bf16 under FSDP2 mixed precision (params are cast in the pre-forward), else fp32."""
        return self.action_expert.action_in.weight.dtype

    def forward(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample flow-matching loss (B,): MSE over valid chunk positions and action dims.

        Positions past the episode end hold the edge action (as LeRobot pads) and stay in the
        input, as they would at inference; they are not targets.
        """
        # Interpolation, target and the time embedding stay in fp32 whatever the compute dtype:
        # a bf16 time is off by up to 2e-3, a whole turn of the embedding's fastest sinusoid.
        actions, noise, time = batch["actions"].float(), noise.float(), time.float()
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        prefix, prefix_mask = self.embed_prefix(batch)
        dtype = self.compute_dtype()
        v = self.action_expert(x_t.to(dtype), time, prefix, prefix_mask)
        err = (v.float() - (noise - actions)).square().mean(-1)
        return masked_mean(err, ~batch["action_is_pad"], dim=1)

    def compute_loss(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """openpi-style name for ``forward``; goes through ``__call__`` so FSDP2 hooks fire."""
        return self(batch, noise, time)

    @torch.no_grad()
    def sample_actions(
        self, obs: dict[str, Any], noise: torch.Tensor, num_steps: int | None = None
    ) -> torch.Tensor:
        """Euler-integrate the velocity from t=1 (noise) to t=0, the prefix computed once.

        Under FSDP2 register this with ``register_fsdp_forward_method(model, "sample_actions")``.
        """
        steps = num_steps or self.config.num_inference_steps
        prefix, prefix_mask = self.embed_prefix(obs)
        dtype = self.compute_dtype()
        x, dt = noise.float(), -1.0 / steps  # the Euler state accumulates in fp32
        for i in range(steps):
            time = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = x + dt * self.action_expert(x.to(dtype), time, prefix, prefix_mask).float()
        return x


def flow_noise_and_time(
    seed: int, step: int, sample_ids: Sequence[int], chunk: int, action_dim: int,
    beta: tuple[float, float] = (1.5, 1.0),
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per-sample flow noise (B, chunk, A) and time (B,), keyed to (seed, step, sample id).

    Keyed to the sample, not the rank, so any world size draws identical noise for a sample.
    t ~ Beta(1.5, 1) mapped to [0.001, 1] as in pi0 (more weight on noisy times).
    """
    noise = np.empty((len(sample_ids), chunk, action_dim), dtype=np.float32)
    time = np.empty(len(sample_ids), dtype=np.float32)
    for i, sid in enumerate(sample_ids):
        rng = np.random.default_rng([int(seed), int(step), int(sid)])
        noise[i] = rng.standard_normal((chunk, action_dim), dtype=np.float32)
        time[i] = rng.beta(*beta) * 0.999 + 0.001
    return torch.from_numpy(noise), torch.from_numpy(time)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters per top-level group and in total (works on meta-device models)."""
    counts = {
        name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()
    }
    counts["total"] = sum(p.numel() for p in model.parameters())
    return counts


@register_model("flow_vla")
def build_flow_vla(
    size: str = "tiny", camera_keys: Sequence[str] = ("observation.image",),
    image_size: Sequence[int] = (32, 32), state_dim: int = 2, action_dim: int = 2,
    chunk_size: int = 8, max_text_len: int = 48, num_inference_steps: int = 10, **overrides: Any,
) -> FlowVLA:  # fmt: skip
    cfg = FlowVLAConfig.from_size(
        size, camera_keys=list(camera_keys), image_size=tuple(image_size), state_dim=state_dim,
        action_dim=action_dim, chunk_size=chunk_size, max_text_len=max_text_len,
        num_inference_steps=num_inference_steps, **overrides,
    )  # fmt: skip
    return FlowVLA(cfg)
