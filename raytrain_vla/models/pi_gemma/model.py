"""pi0 and pi0.5: a PaliGemma VLM (SigLIP tower, projector, Gemma 2B) and a Gemma 300M action
expert attending jointly layer by layer, trained by flow matching (LeRobot 0.6.1's design).

The SigLIP tower is `transformers`' `SiglipVisionTransformer`; each Gemma layer is built from
`transformers`' `GemmaAttention` and `GemmaMLP`, with LeRobot's (adaptive) RMSNorm. Gemma layer
i of both models sits in one `PiJointLayer`, the FSDP unit; the SigLIP blocks, the token
embedding and the two unused LM heads are units too, so every large weight is sharded and
gathered only around the code that uses it. Parameter names map one to one onto LeRobot's
(`lerobot_io.to_lerobot_key`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import SiglipVisionConfig
from transformers.models.siglip.modeling_siglip import SiglipVisionTransformer

from raytrain_vla.models.attention import make_att_2d_masks, time_embedding
from raytrain_vla.models.base import ACTION_EXPERT, ADAPTER, BACKBONE, LANGUAGE, VISION
from raytrain_vla.models.lerobot_vla import LORA, JointLayerModel
from raytrain_vla.models.lora import inject_lora
from raytrain_vla.models.pi_gemma.config import NUM_KV_HEADS, PiConfig
from raytrain_vla.models.pi_gemma.layers import PiGemmaLayer, PiJointLayer, PiRMSNorm, gemma_config

INIT_STD = 0.02  # transformers' `initializer_range` for Gemma and PaliGemma
VLM_ROLES = {VISION, ADAPTER, LANGUAGE, BACKBONE}


def siglip_config(config: PiConfig) -> SiglipVisionConfig:
    """SigLIP as PaliGemma builds it for LeRobot: no pooling head, gelu-tanh, eps 1e-6."""
    vision = SiglipVisionConfig(
        hidden_size=config.vision_width,
        intermediate_size=config.vision_mlp_dim,
        num_hidden_layers=config.vision_layers,
        num_attention_heads=config.vision_heads,
        patch_size=config.patch_size,
        image_size=config.image_resolution[0],
        layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
    )
    vision._attn_implementation = "sdpa"  # LeRobot's tower keeps transformers' default
    return vision


class LMHeads(nn.Module):
    """PaliGemma's and the expert's LM heads: LeRobot stores them (untied), no action reads
    them. Kept so checkpoints go in and out whole; an FSDP unit whose forward never runs, so
    their weights (half a billion values at real size) stay sharded."""

    def __init__(self, config: PiConfig):
        super().__init__()
        self.vlm = nn.Linear(config.vlm_width, config.vocab_size, bias=False)
        self.expert = nn.Linear(config.expert_width, config.vocab_size, bias=False)

    def forward(self, *args: Any) -> None:
        raise RuntimeError("pi0 / pi0.5's LM heads take part in no output")


class PiModel(JointLayerModel):
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        VISION: ("vision.",),
        ADAPTER: ("projector.",),
        LANGUAGE: ("embed_tokens.", "vlm_norm.", "lm_heads.vlm."),
        BACKBONE: (),  # layers.N.vlm.*
        ACTION_EXPERT: (
            "expert_norm.", "lm_heads.expert.", "state_proj.", "action_in_proj.",
            "action_out_proj.", "action_time_mlp_in.", "action_time_mlp_out.", "time_mlp_in.",
            "time_mlp_out.",
        ),  # plus layers.N.expert.*
        LORA: (),  # *.lora_A.* / *.lora_B.*
    }  # fmt: skip

    def __init__(self, config: PiConfig):
        super().__init__()
        self.config = config
        self.vision = SiglipVisionTransformer(siglip_config(config))
        # An arange buffer (not in any checkpoint, so a meta build could not fill it):
        # `embed_image` adds the position table row by row instead.
        del self.vision.embeddings.position_ids
        self.projector = nn.Linear(config.vision_width, config.vlm_width)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.vlm_width)
        vlm = gemma_config(
            config.vlm_width, config.vlm_mlp_dim, config.depth, config.head_dim, config.vocab_size
        )
        expert = gemma_config(
            config.expert_width, config.expert_mlp_dim, config.depth, config.head_dim,
            config.vocab_size,
        )  # fmt: skip
        cond = config.expert_width if config.adarms else None
        self.layers = nn.ModuleList(
            PiJointLayer(
                PiGemmaLayer(vlm, i, None),
                PiGemmaLayer(expert, i, cond),
                config.head_dim,
                NUM_KV_HEADS,
            )  # fmt: skip
            for i in range(config.depth)
        )
        self.vlm_norm = PiRMSNorm(config.vlm_width)
        self.expert_norm = PiRMSNorm(config.expert_width, cond)
        self.lm_heads = LMHeads(config)
        width = config.expert_width
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        if config.adarms:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(config.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
        self._init_as_lerobot()
        if config.lora:
            inject_lora(self, config.lora, r"layers\.\d+\.vlm\.")

    @torch.no_grad()
    def _init_as_lerobot(self) -> None:
        """A fresh model's weights as a fresh LeRobot policy's: `transformers`' init (normal,
        std 0.02) for the token embedding, the projector and the LM heads, where plain modules
        would take N(0, 1) and Kaiming; the rest keeps torch's and SigLIP's own init, as LeRobot's."""
        for weight in (self.embed_tokens.weight, self.projector.weight, self.lm_heads.vlm.weight,
                       self.lm_heads.expert.weight):  # fmt: skip
            weight.normal_(0.0, INIT_STD)
        self.projector.bias.zero_()

    # --- the family contract -------------------------------------------------------------------

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.max_action_dim

    def fsdp_units(self) -> list[nn.Module]:
        """SigLIP blocks, the token embedding, the joint layers, and the LM heads (a unit whose
        forward never runs: their weights stay sharded)."""
        return [*self.vision.encoder.layers, self.embed_tokens, *self.layers, self.lm_heads]

    def activation_checkpoint_units(self) -> list[nn.Module]:
        return [*self.vision.encoder.layers, *self.layers]

    def frozen_parameters(self) -> set[str]:
        """LeRobot's freezing options as roles, plus what gets no gradient in LeRobot either:
        the LM heads, the VLM's final norm and the parts of its last layer whose output no
        action token reads (q_proj, o_proj, post-attention norm, MLP)."""
        roles = set()
        if self.config.freeze_vision_encoder:
            roles.add(VISION)
        if self.config.train_expert_only or self.config.lora:
            roles |= VLM_ROLES
        last = f"layers.{self.config.depth - 1}.vlm."
        unused = tuple(
            f"{last}{part}"
            for part in ("self_attn.q_proj.", "self_attn.o_proj.", "post_attention_layernorm.",
                         "mlp.")
        )  # fmt: skip
        return {
            name
            for name, _ in self.named_parameters()
            if self.role_of(name) in roles or name.startswith(("lm_heads.", "vlm_norm.", *unused))
        }

    # --- embeddings ----------------------------------------------------------------------------

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        """SigLIP's last hidden state through the projector; no scaling (LeRobot's). The
        patch embedding plus the whole position table is SiglipVisionEmbeddings' forward at the
        model's own resolution."""
        embeddings = self.vision.embeddings
        patches = embeddings.patch_embedding(image.to(embeddings.patch_embedding.weight.dtype))
        hidden = patches.flatten(2).transpose(1, 2) + embeddings.position_embedding.weight[None]
        hidden = self.vision.encoder(inputs_embeds=hidden).last_hidden_state
        hidden = self.vision.post_layernorm(hidden)
        return self.projector(hidden.to(self.projector.weight.dtype))

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.embed_tokens(tokens)
        return emb * torch.tensor(math.sqrt(emb.shape[-1]), dtype=emb.dtype, device=emb.device)

    def embed_prefix(
        self, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[image tokens per camera, language tokens]; embeddings, pad mask, block marks (0)."""
        embs, pads = [], []
        for key, image in batch["images"].items():
            emb = self.embed_image(image)
            embs.append(emb)
            pads.append(batch["image_masks"][key][:, None].expand(*emb.shape[:2]))
        lang = self.embed_language(batch["lang_tokens"])
        embs.append(lang.to(embs[0].dtype) if embs else lang)
        pads.append(batch["lang_masks"])
        embs, pads = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        return embs, pads, torch.zeros_like(pads)

    def embed_suffix(
        self, state: torch.Tensor | None, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Expert tokens, their block marks and pi0.5's adaRMS condition.

        pi0: [state_proj(state), action_time_mlp([action_in_proj(x_t), time])], marks 1, 1, 0..
        pi0.5: action_in_proj(x_t), marks 1, 0..; the time conditions the norms instead."""
        cfg = self.config
        dtype = self.action_in_proj.weight.dtype
        action = self.action_in_proj(x_t.to(dtype))
        t_emb = time_embedding(time, cfg.expert_width, cfg.min_period, cfg.max_period)
        t_emb = t_emb.to(torch.float32).to(dtype)
        batch, chunk = action.shape[:2]
        if cfg.adarms:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(t_emb))))
            marks = [1] + [0] * (chunk - 1)
            embs = action
        else:
            cond = None
            t_emb = t_emb[:, None, :].expand_as(action)
            h = self.action_time_mlp_out(
                F.silu(self.action_time_mlp_in(torch.cat([action, t_emb], 2)))
            )
            state_emb = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None, :]
            embs = torch.cat([state_emb, h], dim=1)
            marks = [1, 1] + [0] * (chunk - 1)
        marks_t = torch.tensor(marks, dtype=torch.bool, device=action.device)[None].expand(
            batch, -1
        )
        return embs, marks_t, cond

    def _velocity(self, suffix_out: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        out, _ = self.expert_norm(suffix_out, cond)
        out = out[:, -self.config.chunk_size :].to(torch.float32)
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()

    # --- training and sampling -----------------------------------------------------------------

    def velocity(
        self, batch: dict[str, Any], x_t: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """v(x_t, t) with prefix and expert tokens in one pass (training)."""
        prefix, prefix_pad, prefix_marks = self.embed_prefix(batch)
        suffix, suffix_marks, cond = self.embed_suffix(batch.get("state"), x_t, time)
        suffix = suffix.to(prefix.dtype)
        pads = torch.cat([prefix_pad, prefix_pad.new_ones(suffix_marks.shape)], dim=1)
        marks = torch.cat([prefix_marks, suffix_marks], dim=1)
        mask = make_att_2d_masks(pads, marks)
        positions = torch.cumsum(pads, dim=1) - 1
        for layer in self.layers:
            prefix, suffix, _ = layer(prefix, suffix, mask, positions, cond)
        return self._velocity(suffix, cond)

    def forward(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample loss (B,): the mean over every chunk step and the robot's action dims,
        as LeRobot 0.6.1's pi0 / pi0.5 (`action_is_pad` is not used by their loss); in a
        mixture, over the sample's robot's own action dims."""
        losses = self.flow_losses(batch, noise, time)[:, :, : self.config.action_dim]
        if "action_dim_mask" in batch:
            dims = batch["action_dim_mask"][:, : self.config.action_dim]
            losses = losses * dims.unsqueeze(1)
            count = (dims.sum(dim=1) * losses.shape[1]).clamp_min(1)
            return losses.sum(dim=(1, 2)) / count
        return losses.mean(dim=(1, 2))

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
        steps = self.config.num_inference_steps
        dt = -1.0 / steps
        x = noise.float()
        for step in range(steps):
            time = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=x.device)
            suffix, suffix_marks, cond = self.embed_suffix(
                batch.get("state"), x, time.expand(batch_size)
            )
            suffix = suffix.to(prefix.dtype)
            length = suffix.shape[1]
            suffix_pad = suffix_marks.new_ones(suffix_marks.shape)
            step_mask = torch.cat(
                [
                    prefix_pad[:, None, :].expand(batch_size, length, prefix_len),
                    make_att_2d_masks(suffix_pad, suffix_marks),
                ],
                dim=2,
            )
            step_positions = prefix_pad.sum(dim=-1)[:, None] + torch.cumsum(suffix_pad, dim=1) - 1
            for layer, kv in zip(self.layers, caches, strict=True):
                _, suffix, _ = layer(None, suffix, step_mask, step_positions, cond, kv)
            v = self._velocity(suffix, cond)
            if trace is not None:
                trace.append(v)
            x = x + dt * v
        return x
