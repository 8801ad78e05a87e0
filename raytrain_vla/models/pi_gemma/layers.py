"""pi0 / pi0.5's layers that are not `transformers` modules: the (adaptive) RMSNorm and the joint
layer, operation for operation as LeRobot 0.6.1's `pi_gemma.py` and `compute_layer_complete`.

The joint layer holds Gemma layer i of the VLM and of the action expert. It is the FSDP unit and
the activation-checkpointing unit: LeRobot's joint attention reads each layer's weights
directly, which per-layer FSDP units never gather; here both halves live in one unit whose
`forward` runs through `__call__`, so FSDP2 gathers them together and frees them after.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaAttention, GemmaMLP

from raytrain_vla.models.attention import apply_rope, eager_attention

RMS_EPS = 1e-6


class PiRMSNorm(nn.Module):
    """Gemma's RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)`, or with `cond_dim` pi0.5's
    adaRMS: `(scale, shift, gate) = dense(cond)`, `y = norm(x) * (1 + scale) + shift`; returns
    (y, gate or None) for the gated residual."""

    def __init__(self, dim: int, cond_dim: int | None = None, eps: float = RMS_EPS):
        super().__init__()
        self.eps = eps
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, dim * 3)
            nn.init.zeros_(self.dense.weight)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        var = torch.mean(torch.square(x.float()), dim=-1, keepdim=True)
        normed = x * torch.rsqrt(var + self.eps)
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        modulation = self.dense(cond.to(self.dense.weight.dtype))
        if x.ndim == 3 and modulation.ndim == 2:
            modulation = modulation.unsqueeze(1)
        scale, shift, gate = modulation.chunk(3, dim=-1)
        normed = normed * (1 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


class PiGemmaLayer(nn.Module):
    """A Gemma decoder layer's modules (`transformers`' attention projections and MLP) with
    `PiRMSNorm`s; the joint layer runs them."""

    def __init__(self, config: GemmaConfig, index: int, cond_dim: int | None):
        super().__init__()
        self.self_attn = GemmaAttention(config=config, layer_idx=index)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = PiRMSNorm(config.hidden_size, cond_dim)
        self.post_attention_layernorm = PiRMSNorm(config.hidden_size, cond_dim)


def gemma_config(width: int, mlp_dim: int, depth: int, head_dim: int, vocab: int) -> GemmaConfig:
    """transformers' Gemma config as LeRobot fills it (8 heads, 1 KV head, gelu-tanh, fp32)."""
    from raytrain_vla.models.pi_gemma.config import NUM_HEADS, NUM_KV_HEADS

    return GemmaConfig(
        hidden_size=width,
        intermediate_size=mlp_dim,
        num_hidden_layers=depth,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=head_dim,
        vocab_size=vocab,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=RMS_EPS,
        attention_bias=False,
    )


class PiJointLayer(nn.Module):
    """Depth i of pi0 / pi0.5: the VLM's Gemma layer (prefix) and the expert's (suffix).

    Training runs both streams at once: per stream the input norm and q/k/v, then one attention
    over [prefix; suffix] with the 2-D mask, then per stream o_proj, (gated) residual, norm, MLP,
    (gated) residual. Inference runs the prefix once (returning its post-RoPE K/V) and each Euler
    step runs the suffix alone against that cache.
    """

    def __init__(self, vlm: PiGemmaLayer, expert: PiGemmaLayer, head_dim: int, kv_heads: int):
        super().__init__()
        self.vlm = vlm
        self.expert = expert
        self.head_dim = head_dim
        self.kv_heads = kv_heads

    def forward(
        self,
        prefix: torch.Tensor | None,
        suffix: torch.Tensor | None,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cond: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        """Returns (prefix out, suffix out, the prefix's K/V after RoPE when only the prefix
        ran)."""
        streams = [(self.vlm, prefix, None), (self.expert, suffix, cond)]
        qs, ks, vs, gates = [], [], [], []
        for layer, hidden, c in streams:
            if hidden is None:
                gates.append(None)
                continue
            normed, gate = layer.input_layernorm(hidden, c)
            gates.append(gate)
            attn = layer.self_attn
            normed = normed.to(attn.q_proj.weight.dtype)
            shape = (*normed.shape[:-1], -1, self.head_dim)
            qs.append(attn.q_proj(normed).view(shape))
            ks.append(attn.k_proj(normed).view(shape))
            vs.append(attn.v_proj(normed).view(shape))
        q, k, v = torch.cat(qs, dim=1), torch.cat(ks, dim=1), torch.cat(vs, dim=1)
        q, k = apply_rope(q, positions), apply_rope(k, positions)
        new_cache = (k, v) if suffix is None else None
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        att = eager_attention(mask, q, k, v, self.kv_heads)
        outs: list[torch.Tensor | None] = []
        start = 0
        for (layer, hidden, c), gate in zip(streams, gates, strict=True):
            if hidden is None:
                outs.append(None)
                continue
            end = start + hidden.shape[1]
            o_proj = layer.self_attn.o_proj
            out = gated_residual(hidden, o_proj(att[:, start:end].to(o_proj.weight.dtype)), gate)
            after_attention = out.clone()
            normed, gate2 = layer.post_attention_layernorm(out, c)
            normed = normed.to(layer.mlp.up_proj.weight.dtype)
            outs.append(gated_residual(after_attention, layer.mlp(normed), gate2))
            start = end
        return outs[0], outs[1], new_cache
