"""pi0 / pi0.5's input processor: LeRobot's pre/post-processing (normalisation, prompt,
tokenizer) and the policy's own image preparation (resize with centred padding, [-1, 1]).

`encode` runs in Ray Data read tasks (numpy: tokens, normalised state and actions; images stay
as decoded); `collate` runs on the device (resize and scale in float32 there, as LeRobot does
inside the policy). `Policy` calls the same two methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT
from raytrain_vla.common.image_ops import unit_float
from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.models.base import ImageHook, InputProcessor, collate_masks, encode_targets
from raytrain_vla.models.pi_gemma.config import PI05, PiConfig

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


class PiProcessor(InputProcessor):
    allows_missing_cameras = True

    def __init__(self, config: PiConfig, normalizer: Normalizer, tokenizer: Any):
        self.config = config
        self.normalizer = normalizer
        wiring = zip(config.cameras, config.camera_sources, strict=True)
        self.sources = {cam: src for cam, src in wiring if src}
        self.camera_keys = list(self.sources.values())
        self.state_dim = config.state_dim
        self.action_dim = config.action_dim
        self.tokenizer = tokenizer

    def prompts(self, tasks: np.ndarray, normalized_state: np.ndarray) -> list[str]:
        if self.config.variant == PI05:
            bins = state_bins(normalized_state)
            return [pi05_prompt(str(t), b) for t, b in zip(tasks, bins, strict=True)]
        return [pi0_prompt(str(t)) for t in tasks]

    def tokenize(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ids (N, tokenizer_max_length): `<bos>` first, right-padded, truncated; bool mask."""
        out = self.tokenizer(
            prompts,
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
        images = {src: cols[f"image/{src}"] for src in self.camera_keys if f"image/{src}" in cols}
        if not images:
            raise ValueError(f"no camera in the batch; the policy reads {self.camera_keys}")
        if augment is not None:
            images = augment(images)
        out: dict[str, np.ndarray] = {f"image/{k}": v for k, v in images.items()}
        state = self.normalizer.normalize(STATE, cols["state"]).astype(np.float32)
        out["state"] = np.pad(state, ((0, 0), (0, self.config.max_state_dim - state.shape[1])))
        prompts = self.prompts(np.asarray(cols["task"]), state)
        unique, row = np.unique(np.asarray(prompts, dtype=str), return_inverse=True)
        tokens, mask = self.tokenize(unique.tolist())
        out["lang_tokens"], out["lang_masks"] = tokens[row], mask[row]
        return encode_targets(cols, out, self.normalizer)

    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float (B, C, H, W) -> the model's [-1, 1] input."""
        height, width = self.config.image_resolution
        return resize_with_centred_pad(unit_float(image), height, width) * 2.0 - 1.0

    def collate(self, cols: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Any]:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(x)).to(device, non_blocking=True)

        images, masks = {}, {}
        present = {cam: src for cam, src in self.sources.items() if f"image/{src}" in cols}
        mixture = collate_masks(cols, t)
        for cam, src in present.items():
            images[cam] = self.prepare_image(t(cols[f"image/{src}"]))
            masks[cam] = mixture.get("image_masks", {}).get(src)
            if masks[cam] is None:
                masks[cam] = torch.ones(images[cam].shape[0], dtype=torch.bool, device=device)
        missing = [cam for cam in self.config.cameras if cam not in present]
        for cam in missing[: self.config.empty_cameras]:  # LeRobot: present first, then empties
            images[cam] = torch.full_like(next(iter(images.values())), -1.0)
            masks[cam] = torch.zeros_like(next(iter(masks.values())))
        batch: dict[str, Any] = {
            "images": images,
            "image_masks": masks,
            "lang_tokens": t(cols["lang_tokens"]),
            "lang_masks": t(cols["lang_masks"]).bool(),
            "state": t(cols["state"]).float(),
        }
        if "sample_id" in cols:
            batch["sample_ids"] = t(cols["sample_id"]).long()
        if "actions" in cols:
            actions = t(cols["actions"]).float()
            batch["actions"] = F.pad(actions, (0, self.config.max_action_dim - actions.shape[-1]))
            batch["action_is_pad"] = t(cols["action_is_pad"]).bool()
        if ACTION_DIM_MASK in mixture:
            dims = mixture[ACTION_DIM_MASK]
            batch[ACTION_DIM_MASK] = F.pad(dims, (0, self.config.max_action_dim - dims.shape[-1]))
        if EMBODIMENT in mixture:
            batch[EMBODIMENT] = mixture[EMBODIMENT]
        return batch

    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.normalizer.unnormalize(ACTION, actions[..., : self.action_dim].float())
