"""The input processor most families share: cameras at one size, state and actions normalised.

A family subclasses it for what is its own (flow_vla adds its byte tokenizer; another family
would add its tokenizer and prompt format, or another resize).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT, IMAGE_MASK
from raytrain_vla.common.image_ops import resize_images, unit_float
from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.models.base import ImageHook, InputProcessor, collate_masks, encode_targets


class ImageStateProcessor(InputProcessor):
    """uint8 cameras resized to `image_size` (then `augment`), normalised state and actions.

    Images stay uint8 until `collate`, which scales them to [0, 1] floats on the device: read
    tasks ship a quarter of the bytes. A policy's float frames stay float throughout.
    """

    def __init__(
        self,
        camera_keys: list[str],
        image_size: tuple[int, int],
        state_dim: int,
        action_dim: int,
        normalizer: Normalizer,
    ):
        self.camera_keys = list(camera_keys)
        self.image_size = tuple(image_size)
        self.frame_size = self.image_size  # read tasks resize while decoding (InputProcessor)
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.normalizer = normalizer

    def encode_text(self, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Columns for the instructions; none by default (a family without language)."""
        return {}

    def encode(
        self, cols: dict[str, np.ndarray], augment: ImageHook | None = None
    ) -> dict[str, np.ndarray]:
        images = resize_images({k: cols[f"image/{k}"] for k in self.camera_keys}, self.image_size)
        if augment is not None:
            images = augment(images)
        out = {f"image/{k}": v for k, v in images.items()}
        out["state"] = self.normalizer.normalize(STATE, cols["state"])
        out.update(self.encode_text(cols["task"]))
        return encode_targets(cols, out, self.normalizer)

    def collate(self, cols: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Any]:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(x)).to(device, non_blocking=True)  # writable copy

        batch: dict[str, Any] = {
            "images": {k: unit_float(t(cols[f"image/{k}"])) for k in self.camera_keys},
            "state": t(cols["state"]),
        }
        reserved = {"state", "sample_id", "actions", "action_is_pad", ACTION_DIM_MASK, EMBODIMENT}
        batch.update(
            {
                k: t(v)
                for k, v in cols.items()
                if k not in reserved and not k.startswith(("image/", IMAGE_MASK))
            }
        )
        batch.update(collate_masks(cols, t))
        if "sample_id" in cols:
            batch["sample_ids"] = t(cols["sample_id"]).long()
        if "actions" in cols:
            batch["actions"] = t(cols["actions"])
            batch["action_is_pad"] = t(cols["action_is_pad"]).bool()
        return batch

    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.normalizer.unnormalize(ACTION, actions.float())
