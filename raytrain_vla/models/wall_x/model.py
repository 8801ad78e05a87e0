"""Wall-OSS (X Square Robot's VLA, LeRobot 0.6.1's `wall_x` in flow mode): a Qwen2.5-VL whose
every MLP is a hard-routed pair of experts (the VLM's for text, image and state tokens; an action
expert for the `<|action|>` tokens), trained by flow matching on the action tokens' outputs.

The vision tower is `transformers`' `Qwen2_5_VisionTransformerPretrainedModel` and each decoder
layer `transformers`' `Qwen2_5_VLAttention` with the expert pair (`layers.py`). One pass runs
the whole prompt: text and images causally, the chunk's action tokens bidirectionally among
themselves (an "island"), 3-D multimodal RoPE. The token embedding doubles as the (unused) LM
head; LeRobot stores it as `model.lm_head.weight` (`lerobot_io.py`).

Time follows the trainer's convention (t = 1 is noise); Wall-X's own (t = 1 is data) is 1 - t,
and the trainer's Beta(1.5, 1) draw is then LeRobot's `(1 - Beta(1.5, 1)) * 0.999` exactly.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import nn
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
    Qwen2_5_VLRMSNorm,
)

from raytrain_vla.models.base import ACTION_EXPERT, BACKBONE, LANGUAGE, VISION, VLAModel
from raytrain_vla.models.lerobot_vla import LORA
from raytrain_vla.models.lora import inject_lora
from raytrain_vla.models.wall_x.config import WallXConfig
from raytrain_vla.models.wall_x.layers import (
    ACTION_EXPERT_INDEX,
    ActionHead,
    VisionRotary,
    WallXDecoderLayer,
    island_mask,
    mrope_cos_sin,
)

_ACTION_EXPERT_PARAM = re.compile(rf"^layers\.\d+\.moe\.experts\.{ACTION_EXPERT_INDEX}\.")


def vision_config(config: WallXConfig) -> Qwen2_5_VLVisionConfig:
    vision = Qwen2_5_VLVisionConfig(
        depth=config.vision_depth,
        hidden_size=config.vision_width,
        hidden_act="silu",
        intermediate_size=config.vision_mlp_dim,
        num_heads=config.vision_heads,
        in_channels=3,
        patch_size=config.patch_size,
        spatial_merge_size=config.merge_size,
        temporal_patch_size=config.temporal_patch_size,
        tokens_per_second=config.tokens_per_second,
        window_size=config.window_size,
        out_hidden_size=config.hidden_size,
        fullatt_block_indexes=list(config.fullatt_block_indexes),
    )
    vision._attn_implementation = "sdpa"  # LeRobot's vision attention on CPU: per-window SDPA
    return vision


class WallXModel(VLAModel):
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        VISION: ("visual.",),
        LANGUAGE: ("embed_tokens.", "norm."),
        BACKBONE: ("layers.",),  # but the action expert's MLPs (role_of)
        ACTION_EXPERT: ("action_head.",),
        LORA: (),
    }

    def __init__(self, config: WallXConfig):
        super().__init__()
        self.config = config
        self.visual = Qwen2_5_VisionTransformerPretrainedModel(vision_config(config))
        self.visual.rotary_pos_emb = VisionRotary(config.vision_width // config.vision_heads // 2)
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.layers = nn.ModuleList(WallXDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = Qwen2_5_VLRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.action_head = ActionHead(config)
        if config.lora:  # LeRobot's `add_lora`: adapters on the language model's layers
            inject_lora(self, config.lora, r"layers\.\d+\.")

    def fresh_parameters(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if ".lora_" in name}

    @classmethod
    def role_of(cls, param_name: str) -> str:
        if ".lora_" in param_name:
            return LORA
        if _ACTION_EXPERT_PARAM.match(param_name):
            return ACTION_EXPERT
        return super().role_of(param_name)

    # --- the family contract -------------------------------------------------------------------

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.config.chunk_size, self.config.max_action_dim

    def fsdp_units(self) -> list[nn.Module]:
        """The vision blocks and merger, the token embedding, and the decoder layers (each with
        both experts)."""
        return [*self.visual.blocks, self.visual.merger, self.embed_tokens, *self.layers]

    def activation_checkpoint_units(self) -> list[nn.Module]:
        return [*self.visual.blocks, *self.layers]

    def frozen_parameters(self) -> set[str]:
        """LeRobot's freezing as roles: `freeze_vision_encoder` the vision tower,
        `train_action_expert_only` all but the action expert and head; under LoRA (peft wraps
        the language model) its base weights, as LeRobot's `add_lora` leaves them. Plus what no
        output reads: the last layer's VLM expert (only the action rows leave the model)."""
        cfg = self.config
        roles = {VISION} if cfg.freeze_vision_encoder else set()
        if cfg.train_action_expert_only:
            roles |= {VISION, LANGUAGE, BACKBONE}
        language = ("embed_tokens.", "norm.", "layers.")
        unused = f"layers.{cfg.num_layers - 1}.moe.experts.0."
        return {
            name
            for name, _ in self.named_parameters()
            if self.role_of(name) in roles
            or name.startswith(unused)
            or (cfg.lora and name.startswith(language) and ".lora_" not in name)
        }

    # --- the pass ------------------------------------------------------------------------------

    def prefix_embeddings(self, batch: dict[str, Any]) -> torch.Tensor:
        """Token embeddings with the image rows and the `<|propri|>` row filled in (B, L, W);
        the trailing action rows are filled per flow step (`velocity`)."""
        input_ids = batch["input_ids"]
        embeds = self.embed_tokens(input_ids)
        pixels = batch["pixel_values"]  # (B, patches, values): all images in one packed call
        images = self.visual(
            pixels.reshape(-1, pixels.shape[-1]).to(self.visual.patch_embed.proj.weight.dtype),
            grid_thw=batch["image_grid_thw"].reshape(-1, 3),
        ).pooler_output
        image_rows = (input_ids == self.config.image_token_id)[..., None]
        embeds = embeds.masked_scatter(image_rows, images.to(embeds.dtype))
        state = self.action_head.embed_state(batch["state"], batch["state_mask"])
        state_rows = (input_ids == self.config.propri_token_id)[..., None]
        return embeds.masked_scatter(state_rows, state.to(embeds.dtype))

    def velocity_from(
        self,
        prefix: torch.Tensor,
        batch: dict[str, Any],
        x_t: torch.Tensor,
        wallx_time: torch.Tensor,
        dof_mask: torch.Tensor,
    ) -> torch.Tensor:
        """v (B, T, max_action_dim) for x_t at Wall-X's time, the action rows being the last T
        (prompts end with the chunk's `<|action|>` tokens and are left-padded)."""
        chunk = self.config.chunk_size
        actions = self.action_head.embed_actions(x_t, dof_mask, wallx_time)
        hidden = torch.cat([prefix[:, :-chunk], actions.to(prefix.dtype)], dim=1)
        is_action = batch["input_ids"] == self.config.action_token_id
        mask = island_mask(batch["attention_mask"], is_action, hidden.dtype)
        positions = batch["position_ids"].transpose(0, 1)  # (3, B, L)
        cos_sin = mrope_cos_sin(positions, self.config, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, mask, cos_sin, is_action)
        hidden = self.norm(hidden.to(self.norm.weight.dtype))
        return self.action_head.velocity(hidden[:, -chunk:])

    def flow_losses(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-element `(v - u)^2 * dof_mask` (B, T, max_action_dim), LeRobot's `flow_loss`:
        x_t = t_w a + (1 - t_w) n, u = a - n, with Wall-X's time t_w = 1 - t."""
        actions, noise = batch["actions"].float(), noise.float()
        wallx_time = 1.0 - time.float()
        t = wallx_time[:, None, None]
        x_t = (1 - t) * noise + t * actions
        dof_mask = batch["dof_mask"].float()
        v = self.velocity_from(self.prefix_embeddings(batch), batch, x_t, wallx_time, dof_mask)
        return (v - (actions - noise)) ** 2 * dof_mask

    def forward(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample loss (B,): the masked squared error averaged over every chunk step and
        every padded action dim (absent dims count in the denominator, as LeRobot's mean)."""
        return self.flow_losses(batch, noise, time).mean(dim=(1, 2))

    @torch.no_grad()
    def sample_actions(
        self, batch: dict[str, Any], noise: torch.Tensor, trace: list | None = None
    ) -> torch.Tensor:
        """Euler from noise (Wall-X's t = 0) to data (t = 1) in `num_inference_steps` equal
        steps, the whole sequence re-run at each (LeRobot's torchdiffeq Euler); the DOF mask
        marks the robot's action dims. `trace` collects each step's velocity."""
        cfg = self.config
        prefix = self.prefix_embeddings(batch)
        x = noise.float()
        dof_mask = torch.zeros_like(x)
        dof_mask[..., : cfg.action_dim] = 1.0
        times = torch.linspace(0, 1, cfg.num_inference_steps + 1, device=x.device)
        for step in range(cfg.num_inference_steps):
            wallx_time = times[step].expand(x.shape[0])
            v = self.velocity_from(prefix, batch, x, wallx_time, dof_mask)
            if trace is not None:
                trace.append(v)
            x = x + (times[step + 1] - times[step]) * v
        return x
