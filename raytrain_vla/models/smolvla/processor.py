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

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT
from raytrain_vla.common.image_ops import unit_float
from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.models.base import ImageHook, InputProcessor, collate_masks, encode_targets
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


class SmolVLAProcessor(InputProcessor):
    allows_missing_cameras = True

    def __init__(self, config: SmolVLAConfig, normalizer: Normalizer, tokenizer: Any = None):
        self.config = config
        self.normalizer = normalizer
        # The dataset cameras read, in the model's camera order.
        wiring = zip(config.cameras, config.camera_sources, strict=True)
        self.sources = {cam: src for cam, src in wiring if src}
        self.camera_keys = list(self.sources.values())
        self.state_dim = config.state_dim
        self.action_dim = config.action_dim
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(config.vlm_path)

    def tokenize(self, tasks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ids (N, tokenizer_max_length) right-padded, bool mask; `collate` trims to the
        micro-batch's longest under `pad_language_to: longest` (LeRobot's default)."""
        out = self.tokenizer(
            [with_newline(t) for t in tasks],
            max_length=self.config.tokenizer_max_length,
            truncation=True,
            padding="max_length",
            padding_side="right",
            return_tensors="np",
        )
        return out["input_ids"].astype(np.int64), out["attention_mask"].astype(bool)

    def encode(
        self, cols: dict[str, np.ndarray], augment: ImageHook | None = None
    ) -> dict[str, np.ndarray]:
        # LeRobot's rule: a camera absent from the batch is skipped (or, up to `empty_cameras`,
        # replaced by an empty image); at least one must be there.
        images = {src: cols[f"image/{src}"] for src in self.camera_keys if f"image/{src}" in cols}
        if not images:
            raise ValueError(f"no camera in the batch; the policy reads {self.camera_keys}")
        if augment is not None:
            images = augment(images)
        out: dict[str, np.ndarray] = {f"image/{k}": v for k, v in images.items()}
        state = self.normalizer.normalize(STATE, cols["state"])
        out["state"] = np.pad(state, ((0, 0), (0, self.config.max_state_dim - state.shape[1])))
        unique, row = np.unique(np.asarray(cols["task"], dtype=str), return_inverse=True)
        tokens, mask = self.tokenize(unique.tolist())
        out["lang_tokens"], out["lang_masks"] = tokens[row], mask[row]
        return encode_targets(cols, out, self.normalizer)

    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float (B, C, H, W) -> the model's [-1, 1] input."""
        height, width = self.config.image_hw
        return resize_with_pad(unit_float(image), height, width, pad_value=0.0) * 2.0 - 1.0

    def collate(self, cols: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Any]:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(x)).to(device, non_blocking=True)

        images, masks = {}, {}
        present = {cam: src for cam, src in self.sources.items() if f"image/{src}" in cols}
        mixture = collate_masks(cols, t)  # a mixture: per-sample camera and action masks
        for cam, src in present.items():
            images[cam] = self.prepare_image(t(cols[f"image/{src}"]))
            masks[cam] = mixture.get("image_masks", {}).get(src)
            if masks[cam] is None:
                masks[cam] = torch.ones(images[cam].shape[0], dtype=torch.bool, device=device)
        missing = [cam for cam in self.config.cameras if cam not in present]
        for cam in missing[: self.config.empty_cameras]:  # LeRobot: present first, then empties
            images[cam] = torch.full_like(next(iter(images.values())), -1.0)
            masks[cam] = torch.zeros_like(next(iter(masks.values())))
        tokens, lang_masks = t(cols["lang_tokens"]), t(cols["lang_masks"]).bool()
        if self.config.pad_language_to == "longest":
            longest = max(int(lang_masks.sum(dim=1).max()), 1)
            tokens, lang_masks = tokens[:, :longest], lang_masks[:, :longest]
        batch: dict[str, Any] = {
            "images": images,
            "image_masks": masks,
            "lang_tokens": tokens,
            "lang_masks": lang_masks,
            "state": t(cols["state"]).float(),
        }
        if "sample_id" in cols:
            batch["sample_ids"] = t(cols["sample_id"]).long()
        if "actions" in cols:
            actions = t(cols["actions"]).float()
            pad = self.config.max_action_dim - actions.shape[-1]
            batch["actions"] = F.pad(actions, (0, pad))
            batch["action_is_pad"] = t(cols["action_is_pad"]).bool()
        if ACTION_DIM_MASK in mixture:
            dims = mixture[ACTION_DIM_MASK]
            batch[ACTION_DIM_MASK] = F.pad(dims, (0, self.config.max_action_dim - dims.shape[-1]))
        if EMBODIMENT in mixture:
            batch[EMBODIMENT] = mixture[EMBODIMENT]
        return batch

    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.normalizer.unnormalize(ACTION, actions[..., : self.action_dim].float())
