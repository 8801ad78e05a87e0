"""Wall-OSS's inputs as LeRobot's `wall_x` builds them (`WallXPolicy.preprocess_inputs`).

Read tasks (`encode`): LeRobot's two uint8 resizes of every camera, the task with a final period,
the chat prompt with one `<|image_pad|>` per merged vision token, its Qwen tokens and 3-D RoPE
positions right-aligned in a `TOKENIZER_MAX_LENGTH` row (left padding), and the normalised state.
Micro-batches (`collate`): the HF image processor's patches (B, patches, values) in camera order
with their grids (B, cameras, 3), the rows and their positions (B, 3, L) trimmed to the longest
prompt, state and actions zero-padded with presence masks (NaN entries are absent: 0 with mask
0). Every tensor is batch-first, as the trainer slices and sanitises samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT
from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.models.base import ImageHook, InputProcessor, collate_masks, encode_targets
from raytrain_vla.models.wall_x.config import TOKENIZER_MAX_LENGTH, WallXConfig
from raytrain_vla.models.wall_x.images import lerobot_resize, patch_grid, patchify, tokens_per_image

# Wall-X's `CAMERA_NAME_MAPPING`: the camera's name in the prompt.
CAMERA_NAMES = {
    "face_view": "front view",
    "left_wrist_view": "left wrist view",
    "right_wrist_view": "right wrist view",
    "move1_view": "move view",
    "move2_view": "move view",
    "wall_view": "wall view",
    "top_view": "top view",
}
IMAGE_PAD = "<|image_pad|>"
DEFAULT_TASK = "Execute the robot action."  # LeRobot's, for a sample without a task


def camera_prompt_name(camera: str) -> str:
    """LeRobot's `img_key_mapping`: the key without `observation.images.`, then the mapping,
    else `_` -> space when it names a view, else `+ " view"`."""
    key = camera.removeprefix("observation.images.")
    if key in CAMERA_NAMES:
        return CAMERA_NAMES[key]
    return key.replace("_", " ") if "view" in key else f"{key} view"


def with_period(task: str) -> str:
    """`WallXTaskProcessor`: a task that does not end with '.' gets one."""
    return task if task.endswith(".") else f"{task}."


def prompt(task: str, cameras: list[str], image_tokens: list[int], chunk: int) -> str:
    """`get_wallx_normal_text` for action prediction, after `replace_action_token` (flow mode
    drops the FAST slot), with each image's pad expanded to its merged token count."""
    views = "".join(
        f" {camera_prompt_name(cam)}: <|vision_start|>{IMAGE_PAD * n}<|vision_end|>"
        for cam, n in zip(cameras, image_tokens, strict=True)
    )
    return (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\nObservation:{views}\nInstruction: {task}"
        "\nPredict the next action in robot action.\nProprioception: <|propri|>\n<|im_end|>\n"
        f"<|im_start|>assistant\n{'<|action|>' * chunk}"
    )


def rope_positions(
    ids: np.ndarray, grids: list[tuple[int, int, int]], config: WallXConfig
) -> np.ndarray:
    """Qwen2.5-VL's `get_rope_index` for one unpadded prompt (3, n): text advances all three
    rows by one; an image's tokens get (t, h, w) grid offsets (t = 0 for a still image) from
    where it starts, and the text after it continues at their maximum + 1."""
    merge = config.merge_size
    parts, start, next_pos = [], 0, 0
    image_starts = np.flatnonzero(ids == config.image_token_id)
    for t, h, w in grids:
        end = int(image_starts[image_starts >= start][0])
        text = np.arange(end - start) + next_pos
        parts.append(np.stack([text] * 3))
        gh, gw = h // merge, w // merge
        hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        grid = np.stack([np.zeros(t * gh * gw, np.int64), np.tile(hh.ravel(), t),
                         np.tile(ww.ravel(), t)])  # fmt: skip
        parts.append(grid + (end - start) + next_pos)
        next_pos = int(parts[-1].max()) + 1
        start = end + t * gh * gw
    parts.append(np.stack([np.arange(len(ids) - start) + next_pos] * 3))
    return np.concatenate(parts, axis=1)


def present_and_zeroed(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with NaN -> 0, mask of present entries), both zero-padded on the last dim to
    `width`."""
    mask = (~torch.isnan(x)).float()
    x = torch.nan_to_num(x, nan=0.0)
    pad = (0, width - x.shape[-1])
    return F.pad(x, pad), F.pad(mask, pad)


class WallXProcessor(InputProcessor):
    def __init__(self, config: WallXConfig, normalizer: Normalizer, tokenizer: Any):
        self.config = config
        self.normalizer = normalizer
        self.tokenizer = tokenizer
        wiring = zip(config.cameras, config.camera_sources, strict=True)
        self.sources = {cam: src for cam, src in wiring if src}
        self.camera_keys = list(self.sources.values())
        self.state_dim = config.state_dim
        self.action_dim = config.action_dim
        shapes = [
            shape
            for cam, shape in zip(config.cameras, config.camera_shapes, strict=True)
            if cam in self.sources
        ]
        self.image_tokens = [tokens_per_image(s[1], s[2], config) for s in shapes]
        self.grids = [patch_grid(s[1], s[2], config) for s in shapes]  # (t, h, w) per camera

    # --- read tasks ----------------------------------------------------------------------------

    def prompts(self, tasks: np.ndarray) -> list[str]:
        cameras = list(self.sources)
        return [
            prompt(with_period(str(task)) if task is not None else DEFAULT_TASK, cameras,
                   self.image_tokens, self.config.chunk_size)
            for task in tasks
        ]  # fmt: skip

    def tokens(self, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ids (N, TOKENIZER_MAX_LENGTH) left-padded and their (3, N, TOKENIZER_MAX_LENGTH)
        RoPE positions (pads at 1, as Qwen's); a prompt longer than LeRobot's limit is an
        error (LeRobot would cut its action tokens off)."""
        texts = self.prompts(tasks)
        unique, row = np.unique(np.asarray(texts, dtype=str), return_inverse=True)
        encoded = self.tokenizer(unique.tolist(), add_special_tokens=False)["input_ids"]
        ids = np.full((len(unique), TOKENIZER_MAX_LENGTH), self.config.pad_token_id, np.int64)
        positions = np.ones((3, len(unique), TOKENIZER_MAX_LENGTH), np.int64)
        for i, seq in enumerate(encoded):
            if len(seq) > TOKENIZER_MAX_LENGTH:
                task = tasks[int(np.flatnonzero(row == i)[0])]
                raise ValueError(
                    f"wall_x: the prompt for task {str(task)!r} is {len(seq)} tokens, above "
                    f"LeRobot's limit of {TOKENIZER_MAX_LENGTH} (its images take "
                    f"{sum(self.image_tokens)}); shorten the task or use fewer cameras"
                )
            seq = np.asarray(seq, np.int64)
            ids[i, -len(seq) :] = seq
            positions[:, i, -len(seq) :] = rope_positions(seq, self.grids, self.config)
        return ids[row], positions[:, row]

    def encode(
        self, cols: dict[str, np.ndarray], augment: ImageHook | None = None
    ) -> dict[str, np.ndarray]:
        images = {src: cols[f"image/{src}"] for src in self.camera_keys if f"image/{src}" in cols}
        missing = [src for src in self.camera_keys if src not in images]
        if missing:
            raise ValueError(f"wall_x reads every camera of the policy; the batch lacks {missing}")
        if augment is not None:
            images = augment(images)
        out: dict[str, np.ndarray] = {
            f"image/{src}": lerobot_resize(torch.from_numpy(np.ascontiguousarray(v))).numpy()
            for src, v in images.items()
        }
        out["state"] = self.normalizer.normalize(STATE, cols["state"]).astype(np.float32)
        ids, positions = self.tokens(np.asarray(cols["task"], dtype=object))
        out["input_ids"] = ids
        out["position_ids"] = positions.transpose(1, 0, 2)  # per sample first: (N, 3, L)
        return encode_targets(cols, out, self.normalizer)

    # --- micro-batches -------------------------------------------------------------------------

    def collate(self, cols: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Any]:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(x)).to(device, non_blocking=True)

        cfg = self.config
        ids = t(cols["input_ids"]).long()
        valid = ids != cfg.pad_token_id
        first = int(valid.any(dim=0).float().argmax())  # trim to the longest prompt
        patches, grids = [], []
        for src in self.camera_keys:
            flat, grid = patchify(t(cols[f"image/{src}"]), cfg)
            patches.append(flat.view(grid.shape[0], -1, flat.shape[-1]))
            grids.append(grid)
        state, state_mask = present_and_zeroed(t(cols["state"]).float()[:, None], cfg.max_state_dim)
        batch: dict[str, Any] = {
            "input_ids": ids[:, first:],
            "attention_mask": valid[:, first:],
            "position_ids": t(cols["position_ids"]).long()[:, :, first:],
            "pixel_values": torch.cat(patches, dim=1),
            "image_grid_thw": torch.stack(grids, dim=1),
            "state": state,
            "state_mask": state_mask,
        }
        mixture = collate_masks(cols, t)
        if "sample_id" in cols:
            batch["sample_ids"] = t(cols["sample_id"]).long()
        if "actions" in cols:
            actions, dof_mask = present_and_zeroed(t(cols["actions"]).float(), cfg.max_action_dim)
            if ACTION_DIM_MASK in mixture:
                dims = F.pad(
                    mixture[ACTION_DIM_MASK].float(), (0, cfg.max_action_dim - cfg.action_dim)
                )
                dof_mask = dof_mask * dims[:, None, :]
            batch["actions"], batch["dof_mask"] = actions, dof_mask
            batch["action_is_pad"] = t(cols["action_is_pad"]).bool()
        if EMBODIMENT in mixture:
            batch[EMBODIMENT] = mixture[EMBODIMENT]
        return batch

    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Model actions -> the robot's units: `x * std + mean` (LeRobot's unnormalizer)."""
        return self.normalizer.unnormalize(ACTION, actions[..., : self.action_dim].float())
