"""SmolVLA's input processor: LeRobot's pre/post-processing (tokenizer, normalisation) and the
policy's own image preparation (resize with left/top padding, [-1, 1]), as one object.

`encode` runs in Ray Data read tasks (numpy: tokens, normalised state and actions; images stay
as decoded, so read tasks ship uint8); `collate` runs on the device (resize and scale in float32
there, as LeRobot does inside the policy). `Policy` calls the same two methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from raytrain_vla.common.image_ops import unit_float
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.models.lerobot_vla import LeRobotVLAProcessor
from raytrain_vla.models.smolvla.config import SmolVLAConfig


def resize_with_pad(img: torch.Tensor, height: int, width: int, pad_value: float) -> torch.Tensor:
    """(B, C, h, w) -> (B, C, height, width) without distortion: bilinear (no antialias), then
    padding on the left and top only."""
    h, w = img.shape[2:]
    if (h, w) == (height, width):
        return img
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
    pad_h, pad_w = max(0, height - new_h), max(0, width - new_w)
    return F.pad(resized, (pad_w, 0, pad_h, 0), value=pad_value)


def with_newline(task: str) -> str:
    return task if task.endswith("\n") else f"{task}\n"


class SmolVLAProcessor(LeRobotVLAProcessor):
    def __init__(self, config: SmolVLAConfig, normalizer: Normalizer, tokenizer: Any = None):
        super().__init__(
            config, normalizer, tokenizer or AutoTokenizer.from_pretrained(config.vlm_path)
        )

    def prompts(self, tasks: np.ndarray, normalized_state: np.ndarray) -> list[str]:
        """LeRobot's `smolvla_new_line_processor`: each task ends in one newline."""
        return [with_newline(str(task)) for task in tasks]

    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float (B, C, H, W) -> the model's [-1, 1] input."""
        height, width = self.config.image_hw
        return resize_with_pad(unit_float(image), height, width, pad_value=0.0) * 2.0 - 1.0

    def trim_language(
        self, tokens: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`pad_language_to: longest` (LeRobot's default) trims to the micro-batch's longest."""
        if self.config.pad_language_to == "longest":
            longest = max(int(masks.sum(dim=1).max()), 1)
            tokens, masks = tokens[:, :longest], masks[:, :longest]
        return tokens, masks
