"""The prefix-LM math LeRobot's VLAs share (SmolVLA, pi0, pi0.5): RoPE, the block mask, the
sine-cosine flow-time embedding and eager grouped-query attention, operation for operation as
LeRobot 0.6.1 computes them, so float32 results agree to reordering noise."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ROPE_BASE = 10_000  # hard-coded in LeRobot's apply_rope; the VLM config's rope_theta is ignored


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate-half RoPE in float32 on x (B, L, H, D) at positions (B, L)."""
    d_half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.to(torch.float32)
    exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32, device=x.device)
    timescale = base**exponents
    radians = positions[..., None].to(torch.float32) / timescale[None, None, :]
    radians = radians[..., None, :]
    sin, cos = torch.sin(radians), torch.cos(radians)
    x1, x2 = x.split(d_half, dim=-1)
    out = torch.empty_like(x)
    out[..., :d_half] = x1 * cos - x2 * sin
    out[..., d_half:] = x2 * cos + x1 * sin
    return out.to(dtype)


def make_att_2d_masks(pad_masks: torch.Tensor, block_marks: torch.Tensor) -> torch.Tensor:
    """big_vision's prefix-LM mask: a token sees valid tokens whose cumulative block mark is not
    larger than its own. (B, N) bool pad mask and (B, N) marks -> (B, N, N) bool."""
    cumsum = torch.cumsum(block_marks, dim=1)
    att = cumsum[:, None, :] <= cumsum[:, :, None]
    return att & (pad_masks[:, None, :] * pad_masks[:, :, None])


def time_embedding(
    time: torch.Tensor, dim: int, min_period: float, max_period: float
) -> torch.Tensor:
    """[sin, cos] of the flow time at geometric periods, computed in float64 (B,) -> (B, dim)."""
    dtype = torch.float64 if time.device.type not in ("mps",) else torch.float32
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    scaled = time[..., None] * (1.0 / period * 2 * math.pi)
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=-1)


def eager_attention(
    mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_kv_heads: int
) -> torch.Tensor:
    """q (B, Lq, H, D), k/v (B, Lk, KV, D) -> (B, Lq, H*D); scores and softmax in float32,
    masked with finfo.min, KV heads repeated for grouped-query attention."""
    batch, num_heads, head_dim = q.shape[0], q.shape[2], q.shape[3]
    groups = num_heads // num_kv_heads
    k = (
        k[:, :, :, None, :]
        .expand(*k.shape[:3], groups, head_dim)
        .reshape(*k.shape[:2], -1, head_dim)
    )
    v = (
        v[:, :, :, None, :]
        .expand(*v.shape[:3], groups, head_dim)
        .reshape(*v.shape[:2], -1, head_dim)
    )
    q = q.to(torch.float32).transpose(1, 2)
    k = k.to(torch.float32).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(2, 3)) * head_dim**-0.5
    scores = torch.where(mask[:, None, :, :], scores, torch.finfo(torch.float32).min)
    probs = F.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out.reshape(batch, -1, num_heads * head_dim)
