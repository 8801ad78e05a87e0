"""SmolVLA: a SmolVLM (`transformers`) cut to its first `num_vlm_layers` text layers, plus a
narrower Llama action expert that attends to it, trained by flow matching (LeRobot's design).

The VLM's vision tower, connector, token embeddings and text layers are `transformers` modules
built from the SmolVLM config; the expert is a `transformers` Llama model built from a copy of
the text config (width x `expert_width_multiplier`). Each text layer and the expert layer at the
same depth sit in one `JointLayer`, the FSDP unit. Parameter names map one to one onto LeRobot's
(`lerobot_io.to_lerobot_key`).
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, SmolVLMConfig, SmolVLMForConditionalGeneration

from raytrain_vla.models.base import ACTION_EXPERT, ADAPTER, BACKBONE, LANGUAGE, VISION
from raytrain_vla.models.lerobot_vla import LORA, JointLayerModel
from raytrain_vla.models.lora import inject_lora
from raytrain_vla.models.smolvla.config import SmolVLAConfig
from raytrain_vla.models.smolvla.layers import JointLayer, make_att_2d_masks, time_embedding

STATE = "state"  # the state projection: LeRobot's `train_state_proj` freezes it
VLM_ROLES = {VISION, ADAPTER, LANGUAGE, BACKBONE}


def expert_intermediate_size(hidden: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's `get_intermediate_size`: 2/3 of 4x the width, rounded up to 256."""
    size = int(multiplier * int(2 * hidden / 3))
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


def vlm_config_of(config: SmolVLAConfig) -> SmolVLMConfig:
    return SmolVLMConfig.from_dict(copy.deepcopy(config.vlm_config))


def expert_layer_index(config: SmolVLAConfig, depth: int, num_expert_layers: int) -> int | None:
    """The expert layer at VLM depth `depth` (LeRobot's `get_model_layers`), or None."""
    multiple_of = config.num_vlm_layers // num_expert_layers
    if multiple_of > 0 and depth > 0 and depth % multiple_of != 0:
        return None
    return depth // multiple_of if multiple_of > 0 else depth


class SmolVLA(JointLayerModel):
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        VISION: ("vlm.model.vision_model.",),
        ADAPTER: ("vlm.model.connector.",),
        LANGUAGE: ("vlm.model.text_model.", "vlm.lm_head."),  # embeddings, final norm, head
        BACKBONE: (),  # the text layers: layers.N.vlm.*
        ACTION_EXPERT: (
            "lm_expert.", "action_in_proj.", "action_out_proj.", "action_time_mlp_in.",
            "action_time_mlp_out.",
        ),  # plus layers.N.expert.*
        STATE: ("state_proj.",),
        LORA: (),  # *.lora_A.* / *.lora_B.*
    }  # fmt: skip

    def __init__(self, config: SmolVLAConfig):
        super().__init__()
        self.config = config
        vlm_config = vlm_config_of(config)
        text = vlm_config.text_config
        self.vlm = SmolVLMForConditionalGeneration(vlm_config)
        text_model = self.vlm.model.text_model
        vlm_layers = list(text_model.layers[: config.num_vlm_layers])
        text_model.layers = nn.ModuleList()  # they live in the joint layers
        # RoPE is LeRobot's own (base 10000, `layers.apply_rope`); transformers' rotary tables
        # would only be unused non-persistent buffers.
        text_model.rotary_emb = None

        expert_config = copy.deepcopy(text)
        hidden = int(text.hidden_size * config.expert_width_multiplier)
        expert_config.hidden_size = hidden
        expert_config.intermediate_size = expert_intermediate_size(hidden)
        expert_config.num_hidden_layers = len(vlm_layers)
        if config.num_expert_layers > 0:
            if len(vlm_layers) % config.num_expert_layers:
                raise ValueError(
                    f"num_vlm_layers {len(vlm_layers)} is not a multiple of num_expert_layers "
                    f"{config.num_expert_layers}"
                )
            expert_config.num_hidden_layers = config.num_expert_layers
        self.lm_expert = AutoModel.from_config(expert_config)
        expert_layers = list(self.lm_expert.layers)
        self.lm_expert.layers = nn.ModuleList()
        self.lm_expert.embed_tokens = None
        self.lm_expert.rotary_emb = None
        cross = "cross" in config.attention_mode
        every = config.self_attn_every_n_layers
        kv_width = text.num_key_value_heads * text.head_dim
        if cross:
            for idx, layer in enumerate(expert_layers):
                if every > 0 and idx % every == 0:
                    continue
                out = expert_config.num_key_value_heads * expert_config.head_dim
                bias = expert_config.attention_bias
                layer.self_attn.k_proj = nn.Linear(kv_width, out, bias=bias)
                layer.self_attn.v_proj = nn.Linear(kv_width, out, bias=bias)
        self.layers = nn.ModuleList()
        for depth, vlm_layer in enumerate(vlm_layers):
            index = expert_layer_index(config, depth, len(expert_layers))
            is_cross = cross and not (every > 0 and depth % every == 0)
            expert = expert_layers[index] if index is not None else None
            self.layers.append(
                JointLayer(vlm_layer, expert, is_cross, text.head_dim, text.num_key_value_heads)
            )
        self.expert_hidden = hidden
        width = text.hidden_size
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, hidden)
        self.action_out_proj = nn.Linear(hidden, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(hidden * 2, hidden)
        self.action_time_mlp_out = nn.Linear(hidden, hidden)
        if config.lora:
            inject_lora(self, config.lora, r"layers\.\d+\.vlm\.")
        if config.vlm_dtype == "bfloat16":
            self.vlm.to(torch.bfloat16)
            for layer in self.layers:
                layer.vlm.to(torch.bfloat16)

    # --- the family contract -------------------------------------------------------------------

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.max_action_dim

    def fsdp_units(self) -> list[nn.Module]:
        return [*self.vlm.model.vision_model.encoder.layers, *self.layers]

    def frozen_parameters(self) -> set[str]:
        """LeRobot's freezing options as roles, plus what LeRobot always freezes when the VLM
        trains: the LM head, the final text norm and the last kept text layer(s)."""
        roles = set()
        if self.config.freeze_vision_encoder:
            roles.add(VISION)
        if self.config.train_expert_only or self.config.lora:  # LoRA: the VLM through adapters
            roles |= VLM_ROLES
        if not self.config.train_state_proj:
            roles.add(STATE)
        n_vlm = len(self.layers)
        n_expert = sum(layer.expert is not None for layer in self.layers)
        last = [n_vlm - 1]
        if n_vlm != n_expert and n_expert and n_vlm % n_expert == 0:
            last.append(n_vlm - 2)
        always = ("vlm.lm_head.", "vlm.model.text_model.norm.", *(f"layers.{i}.vlm." for i in last))
        return {
            name
            for name, _ in self.named_parameters()
            if self.role_of(name) in roles or name.startswith(always)
        }

    # --- embeddings ----------------------------------------------------------------------------

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        vision = self.vlm.model.vision_model
        dtype = vision.embeddings.patch_embedding.weight.dtype
        hidden = vision(pixel_values=image.to(dtype), patch_attention_mask=None).last_hidden_state
        return self.vlm.model.connector(hidden)

    def embed_prefix(
        self, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[image tokens per camera, language tokens] x sqrt(width), then the state token.
        Returns embeddings, pad mask and block marks (0: bidirectional, 1: the state token)."""
        embs, pads, marks = [], [], []
        for key, image in batch["images"].items():
            emb = self.embed_image(image)
            emb = emb * torch.tensor(emb.shape[-1] ** 0.5, dtype=emb.dtype, device=emb.device)
            embs.append(emb)
            pads.append(batch["image_masks"][key][:, None].expand(*emb.shape[:2]))
            marks += [0] * emb.shape[1]
        lang = self.vlm.model.text_model.get_input_embeddings()(batch["lang_tokens"])
        embs.append(lang * math.sqrt(lang.shape[-1]))
        pads.append(batch["lang_masks"])
        marks += [0] * lang.shape[1]
        state = batch["state"]
        state_emb = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None, :]
        embs.append(state_emb)  # torch.cat promotes (a bf16 VLM next to an fp32 state_proj)
        pads.append(torch.ones(state.shape[0], 1, dtype=torch.bool, device=state.device))
        marks += [1]
        embs, pads = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        marks = torch.tensor(marks, dtype=torch.bool, device=pads.device)[None, :]
        if pads.shape[1] < self.config.prefix_length:
            extra = self.config.prefix_length - pads.shape[1]
            embs = F.pad(embs, (0, 0, 0, extra))
            pads = F.pad(pads, (0, extra))
            marks = F.pad(marks, (0, extra))
        return embs, pads, marks.expand(pads.shape[0], -1)

    def embed_suffix(self, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """Action tokens: action_in_proj(x_t) next to the time embedding, through the time MLP."""
        dtype = self.action_in_proj.weight.dtype
        action = self.action_in_proj(x_t.to(dtype))
        cfg = self.config
        t_emb = time_embedding(time, self.expert_hidden, cfg.min_period, cfg.max_period)
        t_emb = t_emb.to(action.dtype)[:, None, :].expand_as(action)
        h = self.action_time_mlp_in(torch.cat([action, t_emb], dim=2))
        return self.action_time_mlp_out(F.silu(h))

    def _velocity(self, suffix_out: torch.Tensor) -> torch.Tensor:
        out = self.lm_expert.norm(suffix_out)[:, -self.config.chunk_size :]
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()

    # --- training and sampling -----------------------------------------------------------------

    def velocity(
        self, batch: dict[str, Any], x_t: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """v(x_t, t) with prefix and action tokens in one pass (training)."""
        prefix, prefix_pad, prefix_marks = self.embed_prefix(batch)
        suffix = self.embed_suffix(x_t, time)
        batch_size, chunk = suffix.shape[:2]
        pads = torch.cat([prefix_pad, prefix_pad.new_ones(batch_size, chunk)], dim=1)
        marks = torch.cat([prefix_marks, prefix_marks.new_ones(batch_size, chunk)], dim=1)
        mask = make_att_2d_masks(pads, marks)
        positions = torch.cumsum(pads, dim=1) - 1
        for layer in self.layers:
            prefix, suffix, _ = layer(prefix, suffix, mask, positions)
        return self._velocity(suffix)

    def forward(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample loss (B,): the robot's action dims at valid chunk steps (LeRobot's
        `reduction="none"`)."""
        losses = self.flow_losses(batch, noise, time)[:, :, : self.config.action_dim]
        valid = ~batch["action_is_pad"]
        losses = losses * valid.unsqueeze(-1)
        if "action_dim_mask" in batch:  # a mixture: only the robot's own action dimensions
            dims = batch["action_dim_mask"][:, : self.config.action_dim]
            losses = losses * dims.unsqueeze(1)
            count = (valid.sum(dim=1) * dims.sum(dim=1)).clamp_min(1)
            return losses.sum(dim=(1, 2)) / count
        count = (valid.sum(dim=1) * losses.shape[-1]).clamp_min(1)
        return losses.sum(dim=(1, 2)) / count

    @torch.no_grad()
    def sample_actions(
        self, batch: dict[str, Any], noise: torch.Tensor, trace: list | None = None
    ) -> torch.Tensor:
        """Euler from t=1 to 0 with the prefix's keys and values cached once per layer.
        `trace` (a list) collects each step's velocity."""
        prefix, prefix_pad, prefix_marks = self.embed_prefix(batch)
        mask = make_att_2d_masks(prefix_pad, prefix_marks)
        positions = torch.cumsum(prefix_pad, dim=1) - 1
        caches = []
        for layer in self.layers:
            prefix, _, kv = layer(prefix, None, mask, positions)
            caches.append(kv)
        batch_size, prefix_len = prefix_pad.shape
        chunk = noise.shape[1]
        prefix_2d = prefix_pad[:, None, :].expand(batch_size, chunk, prefix_len)
        causal = make_att_2d_masks(
            prefix_pad.new_ones(batch_size, chunk), prefix_pad.new_ones(batch_size, chunk)
        )
        step_mask = torch.cat([prefix_2d, causal], dim=2)
        offsets = prefix_pad.sum(dim=-1)[:, None]
        step_positions = offsets + torch.arange(chunk, device=noise.device)[None, :]
        steps = self.config.num_steps
        dt = -1.0 / steps
        x = noise.float()
        for step in range(steps):
            time = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=x.device)
            suffix = self.embed_suffix(x, time.expand(batch_size))
            for layer, kv in zip(self.layers, caches, strict=True):
                _, suffix, _ = layer(None, suffix, step_mask, step_positions, kv)
            v = self._velocity(suffix)
            if trace is not None:
                trace.append(v)
            x = x + dt * v
        return x
