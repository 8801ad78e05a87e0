"""Run a policy without Ray: observation in, action chunk in the robot's units out.

The model family's processor prepares the observation exactly as the Ray Data read tasks
prepared training samples (resize, tokens, normalisation), so inference cannot drift from
training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import ModelHubMixin
from safetensors.torch import load_file

from raytrain_vla.common.location import is_uri
from raytrain_vla.common.normalize import STATE, Normalizer
from raytrain_vla.common.run_storage import local_directory
from raytrain_vla.data.embodiment import Embodiment
from raytrain_vla.models.base import InputProcessor, VLAModel
from raytrain_vla.models.registry import read_foreign_policy
from raytrain_vla.policy.format import (
    CHECKPOINT_META,
    CONFIG,
    NORMALIZATION,
    WEIGHTS,
    PolicyMeta,
    check_policy_dir,
    read_meta,
    write_policy,
)
from raytrain_vla.policy.integrity import MANIFEST, verify_checkpoint

STATE_KEYS = (STATE, "state")  # LeRobot's name first; "state" and "instruction" are aliases
TASK_KEYS = ("task", "instruction")


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _camera_chw(key: str, images: np.ndarray | torch.Tensor) -> np.ndarray:
    """(B, H, W, 3) or (B, 3, H, W) images -> (B, 3, H, W) of the same kind: uint8 as training
    decoded it, float (in [0, 1]) as float32, never rounded to uint8. LeRobot hands float frames
    to the model as they are, so rounding them moved a policy's actions (by up to ~2e-3)."""
    if isinstance(images, torch.Tensor):
        x = images.detach().cpu()
    else:  # a copy only where torch cannot view it (a flipped channel or row order)
        x = torch.as_tensor(np.ascontiguousarray(images))
    if x.ndim != 4 or 3 not in (x.shape[1], x.shape[-1]):
        raise ValueError(
            f"camera '{key}': expected (H, W, 3) or (3, H, W) images (batched or not), got shape "
            f"{tuple(x.shape)}"
        )
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise ValueError(
            f"camera '{key}': expected uint8 images or float images in [0, 1], got {x.dtype}"
        )
    x = x.permute(0, 3, 1, 2) if x.shape[1] != 3 else x
    return (x if x.dtype == torch.uint8 else x.float()).contiguous().numpy()


def _first_key(observation: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in observation), None)


class Policy(ModelHubMixin):
    """LeRobot's policy calls: `select_action`, `predict_action_chunk`, `reset`, plus
    `from_pretrained`/`save_pretrained` (huggingface_hub's `ModelHubMixin`).

    An observation uses LeRobot's keys: cameras under their dataset keys (e.g.
    `observation.images.top`), `observation.state` and `task`. Unbatched numpy (HWC or CHW
    images, a (S,) state, one string) or batched tensors ((B, 3, H, W) images, (B, S), B
    strings) are both accepted; actions come back the same way. Images are uint8 (0-255) or
    float in [0, 1]; floats reach the model unrounded, as in LeRobot.
    """

    def __init__(
        self,
        model: VLAModel,
        processor: InputProcessor,
        meta: PolicyMeta,
        seed: int = 0,
        n_action_steps: int = 0,
        normalizer: Normalizer | None = None,
        device: str | torch.device = "cpu",
    ):
        self.device = torch.device(device)
        self.model = model.eval().to(self.device)
        self.processor = processor
        self.meta = meta
        self.normalizer = normalizer
        self.seed = seed
        # Noise is drawn on the CPU: the same seed gives the same actions on any device.
        self.generator = torch.Generator().manual_seed(seed)
        # Actions of each predicted chunk executed before predicting again (0: the whole chunk).
        self.n_action_steps = n_action_steps or meta.data_spec.chunk_size
        self._queue: list[torch.Tensor] = []
        self._batched = False  # the queued chunk's observation was batched

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

    def select_action(
        self, observation: dict, embodiment: str | None = None
    ) -> np.ndarray | torch.Tensor:
        """One action per observation, replanning every `n_action_steps` like LeRobot's
        policies: (action_dim,) numpy for an unbatched observation, (B, action_dim) otherwise.
        `embodiment`: which dataset's robot, for a policy trained on a mixture. Between replans the
        observation is not read (as in LeRobot), so it may lack its frames."""
        if not self._queue:
            emb = self.meta.embodiment(embodiment)
            cols, self._batched = self._columns(observation, emb)
            chunk = self._predict(cols, None, emb)
            self._queue.extend(chunk.transpose(0, 1)[: self.n_action_steps])
        action = self._queue.pop(0)
        return action if self._batched else action[0].cpu().numpy()

    @property
    def needs_observation(self) -> bool:
        """Whether the next `select_action` reads its observation (it replans); between
        replans it only pops the queued chunk, so a simulator may skip rendering that frame."""
        return not self._queue

    @torch.no_grad()
    def predict_action_chunk(
        self, observation: dict, noise: torch.Tensor | None = None, embodiment: str | None = None
    ) -> torch.Tensor | np.ndarray:
        """(B, chunk, action_dim) actions in the robot's units for a batched observation, a
        (chunk, action_dim) numpy array for an unbatched one. `noise` (B, *noise_shape) is
        used as given (LeRobot's `predict_action_chunk(batch, noise=...)`), else drawn from
        the policy's generator. `embodiment`: which dataset's robot, for a policy trained on
        a mixture (its state, cameras and actions are that robot's)."""
        emb = self.meta.embodiment(embodiment)
        cols, batched = self._columns(observation, emb)
        chunk = self._predict(cols, noise, emb)
        return chunk if batched else chunk[0].cpu().numpy()

    def predict_action(self, observation: dict, embodiment: str | None = None) -> np.ndarray:
        """`predict_action_chunk` as numpy (the name of earlier versions)."""
        return _numpy(self.predict_action_chunk(observation, embodiment=embodiment))

    def _columns(
        self, observation: dict, emb: Embodiment | None = None
    ) -> tuple[dict[str, np.ndarray], bool]:
        """The processor's columns, and whether the observation was batched."""
        state_key, task_key = (
            _first_key(observation, STATE_KEYS),
            _first_key(observation, TASK_KEYS),
        )
        camera_keys = list(emb.camera_keys) if emb else self.camera_keys
        state_dim = emb.state_dim if emb else self.state_dim
        cameras = [k for k in camera_keys if k in observation]
        absent = [k for k in camera_keys if k not in observation]
        if (
            not state_key
            or not task_key
            or not cameras
            or (absent and (emb is not None or not self.processor.allows_missing_cameras))
        ):
            missing = [n for n, k in ((STATE, state_key), ("task", task_key)) if not k]
            raise ValueError(
                f"observation is missing {missing + absent}; expected {STATE!r}, 'task' and the "
                f"cameras {camera_keys}"
            )
        state = _numpy(observation[state_key]).astype(np.float32)
        batched = state.ndim == 2
        if state.ndim not in (1, 2) or state.shape[-1] != state_dim:
            raise ValueError(
                f"'{state_key}' must have shape ({state_dim},) or (B, {state_dim}), got "
                f"{tuple(state.shape)}"
            )
        state = state if batched else state[None]
        tasks = observation[task_key]
        tasks = [tasks] if isinstance(tasks, str) else [str(t) for t in tasks]
        if len(tasks) != len(state):
            raise ValueError(f"'{task_key}': {len(tasks)} strings for a batch of {len(state)}")
        cols = {"state": state, "task": np.array(tasks, dtype=object)}
        for key in cameras:
            images = observation[key]
            images = images if isinstance(images, torch.Tensor) else np.asarray(images)
            images = images if batched else images[None]
            cols[f"image/{key}"] = _camera_chw(key, images)
            if len(cols[f"image/{key}"]) != len(state):
                raise ValueError(
                    f"camera '{key}': {len(images)} images for a batch of {len(state)}"
                )
        if emb is not None:  # as the mixture's read tasks lay every robot's samples out
            cols = emb.to_layout(cols, self.meta.layout)
        return cols, batched

    @torch.no_grad()
    def _predict(
        self, cols: dict[str, np.ndarray], noise: torch.Tensor | None,
        emb: Embodiment | None = None,
    ) -> torch.Tensor:  # fmt: skip
        batch = self.processor.collate(self.processor.encode(cols), self.device)
        shape = (len(cols["state"]), *self.model.noise_shape)
        if noise is None:
            noise = torch.randn(shape, generator=self.generator)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {shape}")
        actions = self.model.sample_actions(batch, noise.float().to(self.device))
        actions = self.processor.decode_actions(actions.float())
        return emb.robot_actions(actions) if emb is not None else actions

    def for_embodiment(self, name: str) -> RobotPolicy:
        """This mixture policy for one of its robots, with the single-robot calls."""
        return RobotPolicy(self, name)

    def to(self, device: str | torch.device) -> Policy:
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def save_pretrained(self, save_directory: str | Path, **hub_kwargs: Any) -> None:
        """Our policy format (what `export` writes), replacing the directory in one step once
        the new one is complete. A directory holding anything but a policy is refused, never
        overwritten. `push_to_hub=True` etc. go to huggingface_hub's own upload."""
        if hub_kwargs.get("push_to_hub"):
            super().save_pretrained(save_directory, **hub_kwargs)
            return
        self._save_pretrained(Path(save_directory))

    def _save_pretrained(self, save_directory: Path) -> None:
        if self.normalizer is None:
            raise ValueError("this policy was built without its normalizer; it cannot be saved")
        if save_directory.is_dir() and any(save_directory.iterdir()):
            try:
                check_policy_dir(save_directory)
            except (FileNotFoundError, ValueError) as err:
                raise FileExistsError(
                    f"{save_directory}: exists and is not a policy directory; refusing to "
                    f"overwrite it ({err})"
                ) from err
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        write_policy(save_directory, state, self.meta, self.normalizer)

    @classmethod
    def _from_pretrained(
        cls, *, model_id: str, device: str | torch.device = "cpu", seed: int = 0,
        n_action_steps: int = 0, **hub_kwargs: Any,
    ) -> Policy:  # fmt: skip
        """A local directory (ours or another project's a family reads), else a Hub repo from
        the HF cache."""
        path = Path(model_id)
        if not path.is_dir():
            from huggingface_hub import snapshot_download

            keep = ("revision", "cache_dir", "force_download", "local_files_only", "token")
            path = Path(
                snapshot_download(model_id, **{k: hub_kwargs[k] for k in keep if k in hub_kwargs})
            )
        return load(path, seed=seed, n_action_steps=n_action_steps, device=device)


class RobotPolicy:
    """One robot of a mixture policy behind the single-robot calls (`select_action`,
    `predict_action_chunk`, `reset`, sizes and cameras), so closed-loop evaluation and robot
    code written for one dataset's policy run it unchanged."""

    def __init__(self, policy: Policy, name: str):
        self.policy, self.name = policy, name
        self.embodiment = policy.meta.embodiment(name)

    @property
    def camera_keys(self) -> list[str]:
        return list(self.embodiment.camera_keys)

    @property
    def camera_shapes(self) -> dict[str, tuple[int, int, int]]:
        """(C, H, W) of each camera as the model sees it (the mixture's image size)."""
        return {k: (3, *self.policy.meta.layout.image_hw) for k in self.camera_keys}

    @property
    def state_dim(self) -> int:
        return self.embodiment.state_dim

    @property
    def action_dim(self) -> int:
        return self.embodiment.action_dim

    def reset(self) -> None:
        self.policy.reset()

    def select_action(self, observation: dict) -> np.ndarray | torch.Tensor:
        return self.policy.select_action(observation, embodiment=self.name)

    @property
    def needs_observation(self) -> bool:
        return self.policy.needs_observation

    def predict_action_chunk(
        self, observation: dict, noise: torch.Tensor | None = None
    ) -> torch.Tensor | np.ndarray:
        return self.policy.predict_action_chunk(observation, noise, embodiment=self.name)

    def predict_action(self, observation: dict) -> np.ndarray:
        return self.policy.predict_action(observation, embodiment=self.name)


def from_state(
    state_dict: dict[str, torch.Tensor],
    meta: PolicyMeta,
    normalizer: Normalizer,
    seed: int = 0,
    n_action_steps: int = 0,
    source: str = "state dict",
    device: str | torch.device = "cpu",
) -> Policy:
    """A policy from weights in memory (e.g. gathered mid-training) and its metadata."""
    family = meta.family
    model = family.build(meta.model_config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"{source}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    processor = family.processor(meta.model_config, normalizer)
    return Policy(model, processor, meta, seed, n_action_steps, normalizer, device)


def load(
    path: str | Path,
    seed: int = 0,
    n_action_steps: int = 0,
    device: str | torch.device = "cpu",
    tokenizer: str | Path | None = None,
    options: dict[str, Any] | None = None,
) -> Policy:
    """An exported policy directory (`python -m raytrain_vla.export`, or a run's `export/`),
    or another project's policy directory a model family reads (LeRobot's
    `pretrained_model/`). An object-store URI is downloaded to a temporary directory first.
    A training checkpoint is refused with the export command to run, once its files are
    checked against its manifest: a damaged one is named instead. `tokenizer` (a directory)
    and `options` (the family's, e.g. a SigLIP head count) are for another project's policy
    whose files do not hold them."""
    foreign = dict(options or {})
    if tokenizer is not None:
        foreign["tokenizer"] = str(tokenizer)
    if is_uri(path):
        with local_directory(path) as local:
            return _load_local(local, seed, n_action_steps, device, str(path), foreign)
    return _load_local(Path(path), seed, n_action_steps, device, None, foreign)


def _load_local(
    path: Path, seed: int, n_action_steps: int, device: str | torch.device,
    shown_as: str | None = None, foreign_options: dict[str, Any] | None = None,
) -> Policy:  # fmt: skip
    """`load` of a local directory; `shown_as` names it in errors (the URI it came from)."""
    if not (path / CONFIG).is_file() and any(
        (path / name).is_file() for name in (CHECKPOINT_META, MANIFEST)
    ):
        verify_checkpoint(path, shown_as)
        shown = shown_as or path
        raise FileNotFoundError(
            f"{shown}: a training checkpoint, not a policy directory (no {WEIGHTS}); export it "
            f"with `python -m raytrain_vla.export {shown} OUT`, then load OUT"
        )
    data = json.loads((path / CONFIG).read_text()) if (path / CONFIG).is_file() else {}
    if data and "format" not in data and "model_kwargs" not in data:  # neither version 2 nor 1
        foreign = read_foreign_policy(path, foreign_options)
        if foreign is None:
            raise ValueError(f"{path / CONFIG}: neither our policy format nor one a family reads")
        family, files = foreign
        meta = PolicyMeta(family.name, files.config, files.spec)
        # LeRobot's own replanning (`n_action_steps` in its config.json), so `lerobot-eval`'s
        # protocol holds unless the caller asks otherwise
        n_action_steps = n_action_steps or int(data.get("n_action_steps") or 0)
        return from_state(
            files.state, meta, files.normalizer, seed, n_action_steps, str(path), device
        )  # fmt: skip
    check_policy_dir(path)
    return from_state(
        load_file(str(path / WEIGHTS)), read_meta(path / CONFIG),
        Normalizer.load(path / NORMALIZATION), seed, n_action_steps, str(path / WEIGHTS), device,
    )  # fmt: skip
