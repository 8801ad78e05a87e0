"""Run a policy without Ray: observation in, action chunk in the robot's units out.

The model family's processor prepares the observation exactly as the Ray Data read tasks
prepared training samples (resize, tokens, normalisation), so inference cannot drift from
training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from raytrain_vla.data.normalize import STATE, Normalizer
from raytrain_vla.models.base import InputProcessor, VLAModel
from raytrain_vla.models.registry import read_foreign_policy
from raytrain_vla.policy.format import (
    CONFIG,
    NORMALIZATION,
    WEIGHTS,
    PolicyMeta,
    check_policy_dir,
    read_meta,
)


def _uint8_chw(key: str, img) -> np.ndarray:
    """HWC uint8 or CHW float in [0, 1] -> CHW uint8, as cameras are decoded for training."""
    x = torch.as_tensor(np.asarray(img))
    if x.ndim != 3 or 3 not in (x.shape[0], x.shape[-1]):
        raise ValueError(
            f"camera '{key}': expected an HWC uint8 or CHW float image, got shape {tuple(x.shape)}"
        )
    if x.dtype == torch.uint8:
        x = x.permute(2, 0, 1) if x.shape[-1] == 3 else x
    else:
        x = (x.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.numpy()


class Policy:
    """`predict_action` (a chunk), `select_action` (one action from a queued chunk), `reset`."""

    def __init__(
        self,
        model: VLAModel,
        processor: InputProcessor,
        meta: PolicyMeta,
        seed: int = 0,
        n_action_steps: int = 0,
    ):
        self.model = model.eval()
        self.processor = processor
        self.meta = meta
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        # Actions of each predicted chunk executed before predicting again (0: the whole chunk).
        self.n_action_steps = n_action_steps or meta.data_spec.chunk_size
        self._queue: list[np.ndarray] = []

    @property
    def camera_keys(self) -> list[str]:
        return self.processor.camera_keys

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        """(C, H, W) of each camera in the data it was trained on."""
        return dict(self.meta.data_spec.camera_shapes)

    @property
    def state_dim(self) -> int:
        return self.processor.state_dim

    @property
    def action_dim(self) -> int:
        return self.processor.action_dim

    def reset(self) -> None:
        """Start a new episode: drop queued actions and restart the noise stream."""
        self._queue.clear()
        self.generator.manual_seed(self.seed)

    def select_action(self, observation: dict) -> np.ndarray:
        """One (action_dim,) action, replanning every `n_action_steps` like LeRobot's policies."""
        if not self._queue:
            self._queue.extend(self.predict_action(observation)[: self.n_action_steps])
        return self._queue.pop(0)

    @torch.no_grad()
    def predict_action(self, observation: dict) -> np.ndarray:
        """(chunk_size, action_dim) actions for one observation {camera keys, 'state', 'instruction'}."""
        missing = [k for k in [*self.camera_keys, "state", "instruction"] if k not in observation]
        if missing:
            raise ValueError(f"observation is missing {missing}")
        state = np.asarray(observation["state"], dtype=np.float32)
        if state.shape != (self.state_dim,):
            raise ValueError(
                f"'state' must have shape ({self.state_dim},), got {tuple(state.shape)}"
            )
        cols = {f"image/{k}": _uint8_chw(k, observation[k])[None] for k in self.camera_keys}
        cols["state"] = state[None]
        cols["task"] = np.array([str(observation["instruction"])], dtype=object)
        batch = self.processor.collate(self.processor.encode(cols), "cpu")
        noise = torch.randn((1, *self.model.noise_shape), generator=self.generator)
        actions = self.model.sample_actions(batch, noise)
        return self.processor.decode_actions(actions.float())[0].numpy()

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict, noise: torch.Tensor | None = None) -> torch.Tensor:
        """LeRobot's batch in, (B, chunk, action_dim) actions in the robot's units out.

        `batch`: cameras (B, 3, H, W) float in [0, 1] (or uint8) under their keys, 'observation.state'
        (B, S) in the robot's units, 'task' a list of B strings. As in LeRobot, a camera left out
        is skipped (the family decides; SmolVLA may substitute an empty image). `noise`
        (B, *noise_shape) is used as given (LeRobot's `predict_action_chunk(batch, noise=...)`),
        else drawn from the policy's generator."""
        missing = [k for k in (STATE, "task") if k not in batch]
        if missing or not any(k in batch for k in self.camera_keys):
            raise ValueError(
                f"batch is missing {missing or 'every camera'}; expected {STATE!r}, 'task' and "
                f"cameras among {self.camera_keys}"
            )
        cols = {f"image/{k}": _numpy(batch[k]) for k in self.camera_keys if k in batch}
        cols["state"] = _numpy(batch[STATE]).astype(np.float32)
        cols["task"] = np.array([str(t) for t in batch["task"]], dtype=object)
        model_batch = self.processor.collate(self.processor.encode(cols), "cpu")
        size = cols["state"].shape[0]
        if noise is None:
            noise = torch.randn((size, *self.model.noise_shape), generator=self.generator)
        elif tuple(noise.shape) != (size, *self.model.noise_shape):
            raise ValueError(
                f"noise has shape {tuple(noise.shape)}, expected {(size, *self.model.noise_shape)}"
            )
        actions = self.model.sample_actions(model_batch, noise.float())
        return self.processor.decode_actions(actions.float())


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def from_state(
    state_dict: dict[str, torch.Tensor],
    meta: PolicyMeta,
    normalizer: Normalizer,
    seed: int = 0,
    n_action_steps: int = 0,
    source: str = "state dict",
) -> Policy:
    """A policy from weights in memory (e.g. gathered mid-training) and its metadata."""
    family = meta.family
    model = family.build(meta.model_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"{source}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    processor = family.processor(meta.model_config, normalizer)
    return Policy(model, processor, meta, seed, n_action_steps)


def load(path: str | Path, seed: int = 0, n_action_steps: int = 0) -> Policy:
    """An exported policy directory (`python -m raytrain_vla.export`, or a run's `export/`),
    or another project's policy directory a model family reads (LeRobot's SmolVLA
    `pretrained_model/`)."""
    path = Path(path)
    data = json.loads((path / CONFIG).read_text()) if (path / CONFIG).is_file() else {}
    if data and "format" not in data and "model_kwargs" not in data:  # neither version 2 nor 1
        foreign = read_foreign_policy(path)
        if foreign is None:
            raise ValueError(f"{path / CONFIG}: neither our policy format nor one a family reads")
        family, files = foreign
        meta = PolicyMeta(family.name, files.config, files.spec)
        return from_state(
            files.state, meta, files.normalizer, seed, n_action_steps, str(path)
        )  # fmt: skip
    check_policy_dir(path)
    return from_state(
        load_file(str(path / WEIGHTS)), read_meta(path / CONFIG),
        Normalizer.load(path / NORMALIZATION), seed, n_action_steps, str(path / WEIGHTS),
    )  # fmt: skip
