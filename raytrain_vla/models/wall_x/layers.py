"""Wall-OSS's pieces around `transformers`' Qwen2.5-VL modules: the hard-routed expert pair, the
decoder layer that holds it, the rotary tables without buffers, the attention mask with
bidirectional `<|action|>` islands, and the flow-matching action head.

Rotary frequencies are computed where they are used (a meta-built model has no buffer to fill)
and rounded to bf16, as LeRobot's `to(bfloat16)` leaves its `inv_freq` buffers (they stay rounded
in its float32 variant).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VLAttention,
    Qwen2_5_VLRMSNorm,
)

from raytrain_vla.models.wall_x.config import WallXConfig

VLM_EXPERT, ACTION_EXPERT_INDEX = 0, 1  # expert 0 takes every token but <|action|>


def rounded_inv_freq(dim: int, theta: float, device: torch.device | None) -> torch.Tensor:
    """RoPE's `1 / theta^(2i / dim)` as float32 values rounded to bf16 (LeRobot's)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return (1.0 / (theta**exponents)).to(torch.bfloat16).to(torch.float32)


def mrope_cos_sin(
    position_ids: torch.Tensor, config: WallXConfig, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5-VL's 3-D rotary tables (3, B, L, head_dim) from (3, B, L) positions, computed in
    float32 and cast to `dtype` (`Qwen2_5_VLRotaryEmbedding.forward`)."""
    inv_freq = rounded_inv_freq(config.head_dim, config.rope_theta, position_ids.device)
    freqs = inv_freq[None, None, :, None] * position_ids[:, :, None, :].float()
    emb = torch.cat((freqs, freqs), dim=2).transpose(2, 3)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class VisionRotary(nn.Module):
    """`Qwen2_5_VisionRotaryEmbedding` without its buffer: the (seqlen, dim / 2) angle table."""

    def __init__(self, dim: int, theta: float = 10000.0):
        super().__init__()
        self.dim = dim
        self.theta = theta

    def forward(self, seqlen: torch.Tensor | int) -> torch.Tensor:
        device = seqlen.device if isinstance(seqlen, torch.Tensor) else None
        inv_freq = rounded_inv_freq(self.dim, self.theta, device)
        seq = torch.arange(int(seqlen), device=device, dtype=inv_freq.dtype)
        return torch.outer(seq, inv_freq)


def text_config(config: WallXConfig) -> Qwen2_5_VLTextConfig:
    """The Qwen2.5-VL text config `Qwen2_5_VLAttention` reads (eager attention: the action
    islands need an explicit mask)."""
    text = Qwen2_5_VLTextConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.vlm_mlp_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        rms_norm_eps=config.rms_norm_eps,
        attention_dropout=0.0,
        pad_token_id=config.pad_token_id,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": config.rope_theta,
            "mrope_section": list(config.mrope_section),
        },
    )
    text._attn_implementation = "eager"
    return text


class SwiGLU(nn.Module):
    """One expert: `down(silu(gate(x)) * up(x))`, no biases."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ExpertPair(nn.Module):
    """Wall-X's `SparseMoeBlock`: each token goes to one expert by its type (hard routing), which
    reads and writes the first `dim_inputs[e]` channels (the rest of its output is 0). Both
    experts always run (on no rows if none is theirs), so every rank's graph is the same."""

    def __init__(self, config: WallXConfig):
        super().__init__()
        self.dim_inputs = config.dim_inputs
        self.experts = nn.ModuleList(
            SwiGLU(dim, hidden)
            for dim, hidden in zip(
                config.dim_inputs, (config.vlm_mlp_dim, config.action_mlp_dim), strict=True
            )
        )

    def forward(self, hidden: torch.Tensor, is_action: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        for index, expert in enumerate(self.experts):
            rows = is_action if index == ACTION_EXPERT_INDEX else ~is_action
            dim = self.dim_inputs[index]
            out[rows, :dim] = expert(hidden[rows][:, :dim])
        return out


class WallXDecoderLayer(nn.Module):
    """Qwen2.5-VL's decoder layer with the expert pair as its MLP; activations are cast to each
    block's weight dtype (LeRobot keeps the norms in float32 beside bf16 projections)."""

    def __init__(self, config: WallXConfig, layer_index: int):
        super().__init__()
        self.self_attn = Qwen2_5_VLAttention(text_config(config), layer_index)
        self.input_layernorm = Qwen2_5_VLRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen2_5_VLRMSNorm(
            config.hidden_size, eps=config.rms_norm_eps
        )
        self.moe = ExpertPair(config)

    def forward(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        is_action: torch.Tensor,
    ) -> torch.Tensor:
        residual = hidden
        x = self.input_layernorm(hidden.to(self.input_layernorm.weight.dtype))
        x, _ = self.self_attn(
            hidden_states=x.to(self.self_attn.q_proj.weight.dtype),
            attention_mask=mask,
            position_embeddings=cos_sin,
        )
        hidden = residual + x
        residual = hidden
        x = self.post_attention_layernorm(hidden.to(self.post_attention_layernorm.weight.dtype))
        x = self.moe(x.to(self.moe.experts[0].down_proj.weight.dtype), is_action)
        return residual + x


def island_mask(valid: torch.Tensor, is_action: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive (B, 1, L, L) mask: query i sees key j iff (j <= i, or both are `<|action|>`
    tokens) and j is not padding; masked scores get the dtype's minimum."""
    length = valid.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    allowed = (causal[None] | (is_action[:, :, None] & is_action[:, None, :])) & valid[:, None, :]
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def time_embedding(time: torch.Tensor, width: int) -> torch.Tensor:
    """Wall-X's `SinusoidalPosEmb`: `[sin(t f), cos(t f)]`, `f = exp(-i ln(10000) / (w/2 - 1))`,
    t in [0, 1] as is (not scaled by 1000)."""
    half = width // 2
    freqs = torch.exp(torch.arange(half, device=time.device) * -(math.log(10000) / (half - 1)))
    angles = time[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class ActionHead(nn.Module):
    """Wall-X's `ActionHead` (no biases): noisy actions with their DOF mask and the flow time
    into the `<|action|>` rows, the state with its mask into the `<|propri|>` row, and the
    velocity out of the action rows' final hidden states."""

    def __init__(self, config: WallXConfig):
        super().__init__()
        width = config.hidden_size
        self.w1 = nn.Linear(2 * config.max_action_dim, width, bias=False)
        self.w2 = nn.Linear(2 * width, width, bias=False)
        self.w3 = nn.Linear(width, width, bias=False)
        self.action_proj_back = nn.Linear(width, config.max_action_dim, bias=False)
        self.propri_proj = nn.Linear(2 * config.max_state_dim, width, bias=False)

    def embed_actions(
        self, x_t: torch.Tensor, dof_mask: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """(B, T, W) from x_t (B, T, A), its DOF mask and Wall-X's time (1 = data)."""
        dtype = self.w1.weight.dtype
        action = self.w1(torch.cat([x_t.float(), dof_mask.float()], dim=-1).to(dtype))
        t_emb = time_embedding(time.float(), action.shape[-1])[:, None, :]
        t_emb = t_emb.expand(-1, action.shape[1], -1).to(dtype)
        return self.w3(F.silu(self.w2(torch.cat([action, t_emb], dim=-1))))

    def embed_state(self, state: torch.Tensor, state_mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, W) from the zero-padded state (B, 1, S) and its presence mask."""
        dtype = self.propri_proj.weight.dtype
        return self.propri_proj(torch.cat([state, state_mask], dim=-1).to(dtype))

    def velocity(self, action_hidden: torch.Tensor) -> torch.Tensor:
        return self.action_proj_back(action_hidden.to(self.action_proj_back.weight.dtype)).float()
