"""flow_vla: a pi0-style vision-language-action policy built from scratch (no weight downloads).

Vision: per camera a CoordConv CNN stem whose every conv is FiLM'd by the instruction (RT-1).
Backbone: a transformer over the prefix [image tokens, text tokens, state token].
Action expert: a transformer over the noisy action chunk + flow time, cross-attending to the
prefix, trained with flow matching (x_t = t*noise + (1-t)*a, target noise - a).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from raytrain_vla.models.base import ACTION_EXPERT, BACKBONE, VISION, VLAModel
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.layers import (
    MLP,
    FiLMConvStem,
    SpatialSoftmax,
    TransformerBlock,
    conv_out_size,
    init_linear,
    masked_max,
    masked_mean,
    sinusoidal_embedding,
)
from raytrain_vla.models.flow_vla.tokenizer import VOCAB_SIZE


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
        self.tokens_per_camera = h * w + cfg.keypoints
        self.proj = nn.Linear(cfg.vision_channels[-1], cfg.d_model)
        self.pos = nn.Parameter(torch.empty(len(self.camera_keys), h * w, cfg.d_model))
        # `keypoints` > 0: each camera's grid tokens are followed by K keypoint tokens, a
        # keypoint's (x, y) projected and added to that keypoint's own embedding.
        self.keypoints = nn.ModuleList(
            SpatialSoftmax(cfg.vision_channels[-1], cfg.keypoints)
            for _ in self.camera_keys
            if cfg.keypoints
        )
        if cfg.keypoints:
            self.keypoint_proj = nn.Linear(2, cfg.d_model)
            self.keypoint_pos = nn.Parameter(
                torch.empty(len(self.camera_keys), cfg.keypoints, cfg.d_model)
            )

    def init_weights(self) -> None:
        self.text_pool.reset_parameters()
        self.text_norm.reset_parameters()
        for stem in self.stems:
            stem.init_weights()
        init_linear(self.proj)
        nn.init.normal_(self.pos, std=0.1)
        for keypoints in self.keypoints:  # after the rest: keypoints=0 draws the same weights
            keypoints.init_weights()
        if self.keypoints:
            init_linear(self.keypoint_proj)
            nn.init.normal_(self.keypoint_pos, std=0.1)

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
            if self.keypoints:
                points = self.keypoints[i](x)
                out.append(self.keypoint_proj(points) + self.keypoint_pos[i])
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
        state: torch.Tensor, image_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`image_mask` (B, image tokens): false for a camera the sample's robot lacks."""
        text = text_emb + self.text_pos[: text_emb.shape[1]]
        x = torch.cat([image_tokens, text, self.state_proj(state)[:, None]], dim=1)
        ones = text_mask.new_ones(x.shape[0], image_tokens.shape[1])
        if image_mask is not None:
            ones = image_mask.to(ones.dtype)
        mask = torch.cat([ones, text_mask, text_mask.new_ones(x.shape[0], 1)], dim=1)
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


class FlowVLA(VLAModel):
    """Children ``vision``, ``backbone`` and ``action_expert`` partition all parameters."""

    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        VISION: ("vision.",),
        BACKBONE: ("backbone.",),
        ACTION_EXPERT: ("action_expert.",),
    }

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

    def activation_checkpoint_units(self) -> list[nn.Module]:
        """The transformer blocks, backbone first."""
        return [*self.backbone.blocks, *self.action_expert.blocks]

    def fsdp_units(self) -> list[nn.Module]:
        """Each transformer block, then all cameras' vision tower as one unit."""
        return [*self.activation_checkpoint_units(), self.vision]

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.action_dim

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
        image_mask = None
        if "image_masks" in obs:  # a mixture: cameras a robot lacks are left out of attention
            per_camera = image_tokens.shape[1] // len(self.config.camera_keys)
            image_mask = torch.cat(
                [
                    obs["image_masks"][k][:, None].expand(-1, per_camera)
                    for k in self.config.camera_keys
                ],
                dim=1,
            )
        return self.backbone(
            image_tokens, text_emb, mask, obs["state"].to(text_emb.dtype), image_mask
        )

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
        err = (v.float() - (noise - actions)).square()
        if "action_dim_mask" in batch:  # a mixture: only the robot's own action dimensions
            err = masked_mean(err, batch["action_dim_mask"][:, None, :], dim=-1)
        else:
            err = err.mean(-1)
        return masked_mean(err, ~batch["action_is_pad"], dim=1)

    @torch.no_grad()
    def sample_actions(
        self, obs: dict[str, Any], noise: torch.Tensor, num_steps: int | None = None
    ) -> torch.Tensor:
        """Euler-integrate the velocity from t=1 (noise) to t=0, the prefix computed once."""
        steps = num_steps or self.config.num_inference_steps
        prefix, prefix_mask = self.embed_prefix(obs)
        dtype = self.compute_dtype()
        x, dt = noise.float(), -1.0 / steps  # the Euler state accumulates in fp32
        for i in range(steps):
            time = torch.full((x.shape[0],), 1.0 + i * dt, device=x.device)
            x = x + dt * self.action_expert(x.to(dtype), time, prefix, prefix_mask).float()
        return x


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters per top-level group and in total (works on meta-device models)."""
    counts = {
        name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()
    }
    counts["total"] = sum(p.numel() for p in model.parameters())
    return counts
