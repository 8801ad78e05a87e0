"""Load an exported policy and run it, without Ray: `raytrain_vla.policy.load(DIR).predict_action(obs)`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from raytrain_vla.data.augment import resize_images
from raytrain_vla.data.transforms import Normalizer
from raytrain_vla.export import CONFIG, NORMALIZATION, WEIGHTS
from raytrain_vla.models.registry import build_model
from raytrain_vla.models.tokenizer import tokenize


class Policy:
    """Observation dict in, action chunk in the robot's original units out."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: dict,
        normalizer: Normalizer,
        seed: int = 0,
        n_action_steps: int = 0,
    ):
        self.model = model.eval()
        self.config = config
        self.kwargs = config["model_kwargs"]
        self.normalizer = normalizer
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        # Actions of each predicted chunk executed before predicting again (0: the whole chunk).
        self.n_action_steps = n_action_steps or self.kwargs["chunk_size"]
        self._queue: list[np.ndarray] = []

    def reset(self) -> None:
        """Start a new episode: drop queued actions and restart the noise stream."""
        self._queue.clear()
        self.generator.manual_seed(self.seed)

    def select_action(self, observation: dict) -> np.ndarray:
        """One (action_dim,) action, replanning every `n_action_steps` like LeRobot's policies."""
        if not self._queue:
            self._queue.extend(self.predict_action(observation)[: self.n_action_steps])
        return self._queue.pop(0)

    def _image(self, key: str, img) -> torch.Tensor:
        """HWC uint8 or CHW float in [0, 1] -> (1, 3, H, W) float at the model's resolution."""
        x = torch.as_tensor(np.asarray(img))
        if x.ndim != 3 or 3 not in (x.shape[0], x.shape[-1]):
            raise ValueError(
                f"camera '{key}': expected an HWC uint8 or CHW float image, got shape {tuple(x.shape)}"
            )
        if x.dtype == torch.uint8:
            x = x.permute(2, 0, 1) if x.shape[-1] == 3 else x
        else:
            x = (x.float().clamp(0, 1) * 255).round().to(torch.uint8)
        size = tuple(self.kwargs["image_size"])
        if tuple(x.shape[-2:]) != size:  # trained with `data.image_size`: same resize as training
            x = torch.from_numpy(resize_images({key: x[None].numpy()}, size)[key][0])
        return x.float()[None] / 255.0

    @torch.no_grad()
    def predict_action(self, observation: dict) -> np.ndarray:
        """(chunk_size, action_dim) actions for one observation {camera keys, 'state', 'instruction'}."""
        missing = [
            k for k in [*self.kwargs["camera_keys"], "state", "instruction"] if k not in observation
        ]
        if missing:
            raise ValueError(f"observation is missing {missing}")
        state = torch.as_tensor(np.asarray(observation["state"], dtype=np.float32))
        if state.shape != (self.kwargs["state_dim"],):
            raise ValueError(
                f"'state' must have shape ({self.kwargs['state_dim']},), got {tuple(state.shape)}"
            )
        tokens, mask = tokenize([observation["instruction"]], self.kwargs["max_text_len"])
        obs = {
            "images": {k: self._image(k, observation[k]) for k in self.kwargs["camera_keys"]},
            "state": self.normalizer.normalize("observation.state", state[None]),
            "text_tokens": tokens,
            "text_mask": mask,
        }
        shape = (1, self.kwargs["chunk_size"], self.kwargs["action_dim"])
        noise = torch.randn(shape, generator=self.generator)
        actions = self.model.sample_actions(obs, noise)
        return self.normalizer.unnormalize("action", actions.float())[0].numpy()


def from_state(
    state_dict: dict[str, torch.Tensor],
    config: dict,
    normalizer: Normalizer,
    seed: int = 0,
    n_action_steps: int = 0,
    source: str = "state dict",
) -> Policy:
    """A policy from weights in memory (e.g. gathered mid-training) and its `config.json` dict."""
    model = build_model(config["model_type"], config["model_kwargs"])
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"{source}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    return Policy(model, config, normalizer, seed, n_action_steps)


def load(path: str | Path, seed: int = 0, n_action_steps: int = 0) -> Policy:
    path = Path(path)
    for name in (WEIGHTS, CONFIG, NORMALIZATION):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: not a policy directory (missing {name})")
    config = json.loads((path / CONFIG).read_text())
    return from_state(
        load_file(str(path / WEIGHTS)), config, Normalizer.load(path / NORMALIZATION),
        seed, n_action_steps, str(path / WEIGHTS),
    )  # fmt: skip
