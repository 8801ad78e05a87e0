"""Small building blocks for the built-in VLA: attention, FiLM, CoordConv, keypoints, time steps.

Blocks hold no buffers, so a model built on the meta device needs only ``init_weights`` after
``to_empty`` (torchtitan's build order: meta model, shard, init, optimizer, checkpoint load).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def init_linear(layer: nn.Linear, std: float | None = None, zero: bool = False) -> None:
    """Truncated-normal weights (LeCun std 1/sqrt(fan_in) by default) and zero bias.

    Scale-aware: 0.02 (GPT-style) is right for d~2048 but starves a d=64 model of signal.
    """
    std = layer.in_features**-0.5 if std is None else std
    if zero:
        nn.init.zeros_(layer.weight)
    else:
        nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def key_padding_bias(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) bool (True = attend) -> (B, 1, 1, S) mask that SDPA broadcasts over heads/queries.

    A (B, 1, N, S) mask passes through unchanged (per-query masks, e.g. padded action tokens).
    """
    if mask is None or mask.dim() == 4:
        return mask
    return mask[:, None, None, :]


class Attention(nn.Module):
    """Multi-head attention over ``context`` (self-attention when it is None) via SDPA."""

    def __init__(self, dim: int, num_heads: int, context_dim: int | None = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(context_dim or dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def init_weights(self) -> None:
        for layer in (self.q, self.kv, self.out):
            init_linear(layer)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, n, d = x.shape
        h = self.num_heads
        ctx = x if context is None else context
        q = self.q(x).view(b, n, h, d // h).transpose(1, 2)
        k, v = self.kv(ctx).view(b, ctx.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_padding_bias(context_mask))
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, out_dim: int | None = None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim or dim)

    def init_weights(self, zero_last: bool = False) -> None:
        init_linear(self.fc1)
        init_linear(self.fc2, zero=zero_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: self-attention, optional cross-attention to a prefix, then an MLP.

    Each block is one FSDP unit and one activation-checkpointing unit, so it takes plain tensors.
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, context_dim: int | None = None
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.cross = context_dim is not None
        if self.cross:
            self.norm_x = nn.LayerNorm(dim)
            self.cross_attn = Attention(dim, num_heads, context_dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, int(dim * mlp_ratio))

    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.reset_parameters()
            elif isinstance(m, (Attention, MLP)):
                m.init_weights()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), context_mask=mask)
        if self.cross:
            x = x + self.cross_attn(self.norm_x(x), context, context_mask)
        return x + self.mlp(self.norm2(x))


class FiLM(nn.Module):
    """Feature-wise linear modulation ``x * (1 + gamma) + beta`` from a conditioning vector.

    The generator's last layer starts at zero, so FiLM starts as the identity and the CNN first
    learns plain visual features; language then bends them (RT-1's FiLM-EfficientNet recipe).
    """

    def __init__(self, cond_dim: int, channels: int, hidden: int):
        super().__init__()
        self.mlp = MLP(cond_dim, hidden, 2 * channels)

    def init_weights(self) -> None:
        self.mlp.init_weights(zero_last=True)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.mlp(cond).chunk(2, dim=-1)
        shape = (x.shape[0], -1) + (1,) * (x.dim() - 2)
        return x * (1 + gamma.reshape(shape)) + beta.reshape(shape)


def add_coords(x: torch.Tensor) -> torch.Tensor:
    """CoordConv: append x and y pixel-centre coordinates in [-1, 1] as two extra channels.

    Plain convolutions are translation invariant; the coordinates let a tiny CNN say *where*.
    """
    b, _, h, w = x.shape
    return torch.cat([x, cell_centres(h, w, x.device, x.dtype).expand(b, 2, h, w)], dim=1)


def cell_centres(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2, H, W): each cell centre's x and y in [-1, 1], what CoordConv and keypoints share."""
    ys = torch.linspace(-1 + 1 / h, 1 - 1 / h, h, device=device, dtype=dtype)
    xs = torch.linspace(-1 + 1 / w, 1 - 1 / w, w, device=device, dtype=dtype)
    return torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=0)


class FiLMConvStem(nn.Module):
    """One camera's CoordConv CNN whose every conv is FiLM'd by the instruction.

    RT-1's FiLM-EfficientNet in miniature: language picks *which* disc the features light up
    before any attention runs, which is what makes grounding learnable fast from scratch.
    """

    def __init__(self, channels: Sequence[int], strides: Sequence[int], cond_dim: int):
        super().__init__()
        self.convs, self.films, in_ch = nn.ModuleList(), nn.ModuleList(), 3 + 2
        for ch, stride in zip(channels, strides, strict=True):
            self.convs.append(nn.Conv2d(in_ch, ch, 3, stride=stride, padding=1))
            self.films.append(FiLM(cond_dim, ch, cond_dim))
            in_ch = ch

    def init_weights(self) -> None:
        for conv in self.convs:
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
        for film in self.films:
            film.init_weights()

    def forward(self, images: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [0, 1], cond (B, cond_dim) -> features (B, C, h, w)."""
        x = add_coords(images * 2 - 1)
        for conv, film in zip(self.convs, self.films, strict=True):
            x = F.relu(film(conv(x), cond))
        return x


class SpatialSoftmax(nn.Module):
    """Keypoints of a feature map: each of K learned 1x1-conv channels' softmax-weighted mean
    (x, y) in [-1, 1] (Levine et al. 2016; robomimic's and Diffusion Policy's visual encoders).

    A grid token says "the puck is in this 8 x 8 px cell"; a keypoint says where, to a fraction
    of a cell, which is the precision reach, push and pick-place need of a 2-3 px marker.
    """

    def __init__(self, channels: int, keypoints: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, keypoints, 1)
        self.log_temperature = nn.Parameter(torch.empty(keypoints))  # learned sharpness per point

    def init_weights(self) -> None:
        self.conv.reset_parameters()
        nn.init.zeros_(self.log_temperature)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (B, C, h, w) -> keypoints (B, K, 2) as (x, y)."""
        _, _, h, w = features.shape
        logits = self.conv(features).flatten(2) * self.log_temperature.exp()[:, None]
        weights = logits.float().softmax(-1).to(features.dtype)  # (B, K, h*w)
        grid = cell_centres(h, w, features.device, features.dtype).flatten(1).T  # (h*w, 2)
        return weights @ grid


def conv_out_size(size: int, stride: int, kernel: int = 3, padding: int = 1) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def sinusoidal_embedding(
    t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0
) -> torch.Tensor:
    """pi0's sine-cosine embedding of a scalar in [0, 1]; periods span min..max_period."""
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    frac = torch.linspace(0.0, 1.0, dim // 2, device=t.device, dtype=torch.float32)
    period = min_period * (max_period / min_period) ** frac
    angle = t.float()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).to(t.dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of ``x`` over ``dim`` where ``mask`` is True; all-masked rows give 0, not NaN."""
    while mask.dim() < x.dim():
        mask = mask.unsqueeze(-1)
    total = torch.where(mask, x, torch.zeros_like(x)).sum(dim)  # where, not *: NaN-safe
    return total / mask.to(x.dtype).sum(dim).clamp(min=1.0)


def masked_max(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Max of ``x`` (B, L, D) over ``dim`` where ``mask`` (B, L) is True; empty rows give 0."""
    neg = torch.finfo(x.dtype).min
    out = x.masked_fill(~mask.unsqueeze(-1), neg).amax(dim)
    return torch.where(mask.any(dim).unsqueeze(-1), out, torch.zeros_like(out))
