"""pi0 / pi0.5's input processor: LeRobot's pre/post-processing (normalisation, prompt,
tokenizer) and the policy's own image preparation (resize with centred padding, [-1, 1]).

`encode` runs in Ray Data read tasks (numpy: tokens, normalised state and actions; images stay
as decoded); `collate` runs on the device (resize and scale in float32 there, as LeRobot does
inside the policy). `Policy` calls the same two methods.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raytrain_vla.common.image_ops import unit_float
from raytrain_vla.models.lerobot_vla import LeRobotVLAProcessor
from raytrain_vla.models.pi_gemma.config import PI05

STATE_BINS = 256  # pi0.5's discretised state: 256 bins over [-1, 1]


def resize_with_centred_pad(img: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, C, h, w) in [0, 1] -> (B, C, height, width) without distortion: bilinear (no
    antialias), clamped to [0, 1], zero padding split evenly (the odd pixel at the bottom/right),
    as LeRobot's pi0 `resize_with_pad_torch`."""
    h, w = img.shape[2:]
    if (h, w) != (height, width):
        ratio = max(w / width, h / height)
        new_h, new_w = int(h / ratio), int(w / ratio)
        img = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
        img = img.clamp(0.0, 1.0)
        pad_h, pad_w = height - new_h, width - new_w
        top, left = pad_h // 2, pad_w // 2
        img = F.pad(img, (left, pad_w - left, top, pad_h - top), value=0.0)
    return img


def pi0_prompt(task: str) -> str:
    """pi0's prompt: the task ending in one newline (LeRobot's `pi0_new_line_processor`)."""
    return task if task.endswith("\n") else f"{task}\n"


def state_bins(normalized_state: np.ndarray) -> np.ndarray:
    """pi0.5's 256 bins of the normalised, unpadded state: `digitize` over [-1, 1); a value
    below -1 gives -1 and one at or above 1 - 2/256 gives 255, as LeRobot computes them."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
    return np.digitize(normalized_state, bins=edges) - 1


def pi05_prompt(task: str, bins: np.ndarray) -> str:
    """`Task: <task>, State: <bins>;\\nAction: ` (LeRobot's `Pi05PrepareStateTokenizerProcessorStep`)."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins.tolist()))};\nAction: "


class PiProcessor(LeRobotVLAProcessor):
    def prompts(self, tasks: np.ndarray, normalized_state: np.ndarray) -> list[str]:
        if self.config.variant == PI05:
            bins = state_bins(normalized_state[:, : self.state_dim])
            return [pi05_prompt(str(t), b) for t, b in zip(tasks, bins, strict=True)]
        return [pi0_prompt(str(t)) for t in tasks]

    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float (B, C, H, W) -> the model's [-1, 1] input."""
        height, width = self.config.image_resolution
        return resize_with_centred_pad(unit_float(image), height, width) * 2.0 - 1.0
