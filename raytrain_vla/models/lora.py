"""LoRA adapters (peft) on a family's language layers: the options as a dict, injection, and
merging into the base weights for export."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from raytrain_vla.config.schema import LoRAConfig


def lora_dict(lora: LoRAConfig | None) -> dict[str, Any]:
    if lora is None or not lora.r:
        return {}
    return {
        "r": lora.r,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
    }


def merge_lora(state: dict[str, torch.Tensor], lora: dict[str, Any]) -> dict[str, torch.Tensor]:
    scale = float(lora["alpha"]) / int(lora["r"])
    merged = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            prefix, param = name.split(".base_layer.")
            if param == "weight":
                a = state[f"{prefix}.lora_A.default.weight"].float()
                b = state[f"{prefix}.lora_B.default.weight"].float()
                tensor = (tensor.float() + (b @ a) * scale).to(tensor.dtype)
            name = f"{prefix}.{param}"
        merged[name] = tensor
    return merged


def inject_lora(model: nn.Module, lora: dict[str, Any], layer_pattern: str) -> None:
    """peft's LoRA layers around the named modules of every VLM text layer, in place.

    peft leaves only the adapters trainable; requires_grad is restored here, since what trains
    is the model's `frozen_parameters` and the trainer's decision."""
    from peft import LoraConfig, inject_adapter_in_model  # imported only when LoRA is on

    names = "|".join(re.escape(m) for m in lora["target_modules"])
    config = LoraConfig(
        r=int(lora["r"]),
        lora_alpha=float(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=rf"^{layer_pattern}.*\b({names})$",
        bias="none",
    )
    inject_adapter_in_model(config, model)
    for param in model.parameters():
        param.requires_grad_(True)
