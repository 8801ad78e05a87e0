"""SmolVLA's joint layer and the projections around it (RoPE, masks and attention: `models/attention.py`).

Every function reproduces LeRobot 0.6.1's SmolVLA (`smolvlm_with_expert.py`, `vla_utils.py`)
operation for operation, so float32 results agree to reordering noise (the fixture's README lists
the facts; `tests/unit/test_smolvla_fixture.py` checks them).
"""

from __future__ import annotations

import torch
from torch import nn

from raytrain_vla.models.attention import (  # noqa: F401 (smolvla's callers)
    apply_rope,
    eager_attention,
    make_att_2d_masks,
    time_embedding,
)


def _project_qkv(layer: nn.Module, hidden: torch.Tensor, head_dim: int):
    h = layer.input_layernorm(hidden)
    h = h.to(layer.self_attn.q_proj.weight.dtype)
    shape = (*h.shape[:-1], -1, head_dim)
    attn = layer.self_attn
    return attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)


def _finish_layer(layer: nn.Module, att: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """o_proj, residual, post-attention norm, MLP, residual (a Llama block's second half)."""
    out = layer.self_attn.o_proj(att.to(layer.self_attn.o_proj.weight.dtype))
    out += residual
    after_attention = out.clone()
    out = layer.mlp(layer.post_attention_layernorm(out))
    out += after_attention
    return out


class JointLayer(nn.Module):
    """One depth of SmolVLA: a SmolVLM text layer (prefix) and, where there is one, an expert
    layer (action tokens). The FSDP unit and the activation-checkpointing unit, so both halves
    are gathered together and their forward goes through `__call__`.

    Self-attention layers attend over [prefix; actions] with the 2-D mask; cross-attention
    layers let the prefix attend to itself and the action queries to the prefix's post-RoPE keys
    and values, re-projected by the expert's `k_proj`/`v_proj`. With a KV cache (inference), the
    prefix is run once (`prefix` only, every layer self-attends and caches) and each Euler step
    runs the action tokens alone against the cache.
    """

    def __init__(
        self, vlm: nn.Module, expert: nn.Module | None, cross: bool, head_dim: int, kv_heads: int
    ):
        super().__init__()
        self.vlm = vlm
        self.expert = expert
        self.cross = cross
        self.head_dim = head_dim
        self.kv_heads = kv_heads

    def forward(
        self,
        prefix: torch.Tensor | None,
        suffix: torch.Tensor | None,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        """Returns (prefix out, suffix out, this layer's prefix K/V after RoPE)."""
        if self.cross and cache is not None and prefix is None:
            return None, self._cross_expert(suffix, cache, mask, positions), cache
        if self.cross and prefix is not None and suffix is not None:
            return self._cross_train(prefix, suffix, mask, positions)
        return self._joint(prefix, suffix, mask, positions, cache)

    def _joint(self, prefix, suffix, mask, positions, cache):
        streams = [(self.vlm, prefix), (self.expert, suffix)]
        qs, ks, vs = [], [], []
        for layer, hidden in streams:
            if hidden is None or layer is None:
                continue
            q, k, v = _project_qkv(layer, hidden, self.head_dim)
            qs.append(q), ks.append(k), vs.append(v)
        if not qs:  # action tokens only, and no expert layer at this depth
            return prefix, suffix, cache
        q, k, v = torch.cat(qs, dim=1), torch.cat(ks, dim=1), torch.cat(vs, dim=1)
        length = q.shape[1]
        if length < positions.shape[1]:  # the suffix has no layer at this depth
            positions, mask = positions[:, :length], mask[:, :length, :length]
        q, k = apply_rope(q, positions), apply_rope(k, positions)
        new_cache = None
        if prefix is not None:
            new_cache = (k, v)
        elif cache is not None:  # action tokens against the cached prefix
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        att = eager_attention(mask, q, k, v, self.kv_heads)
        outs, start = [], 0
        for layer, hidden in streams:
            if hidden is None:
                outs.append(None)
                continue
            if layer is None:
                outs.append(hidden)
                continue
            end = start + hidden.shape[1]
            outs.append(_finish_layer(layer, att[:, start:end], hidden))
            start = end
        return outs[0], outs[1], new_cache

    def _cross_train(self, prefix, suffix, mask, positions):
        length = prefix.shape[1]
        q, k, v = _project_qkv(self.vlm, prefix, self.head_dim)
        prefix_pos = positions[:, :length]
        q, k = apply_rope(q, prefix_pos), apply_rope(k, prefix_pos)
        att = eager_attention(mask[:, :length, :length], q, k, v, self.kv_heads)
        prefix_out = _finish_layer(self.vlm, att, prefix)
        suffix_out = self._cross_expert(suffix, (k, v), mask, positions[:, length:])
        return prefix_out, suffix_out, None

    def _cross_expert(self, suffix, prefix_kv, mask, positions):
        if self.expert is None:
            return suffix
        layer = self.expert
        h = layer.input_layernorm(suffix).to(layer.self_attn.q_proj.weight.dtype)
        q = layer.self_attn.q_proj(h).view(*h.shape[:-1], -1, self.head_dim)
        k, v = prefix_kv
        dtype = layer.self_attn.k_proj.weight.dtype
        k = layer.self_attn.k_proj(k.to(dtype).reshape(*k.shape[:2], -1))
        v = layer.self_attn.v_proj(v.to(dtype).reshape(*v.shape[:2], -1))
        k = k.view(*k.shape[:-1], -1, self.head_dim)
        v = v.view(*v.shape[:-1], -1, self.head_dim)
        positions = positions - positions.min(dim=1, keepdim=True).values  # restart at 0
        q = apply_rope(q, positions)
        att = eager_attention(mask[:, -suffix.shape[1] :, : k.shape[1]], q, k, v, self.kv_heads)
        return _finish_layer(layer, att, suffix)
