"""What LeRobot's VLA families share (SmolVLA, pi0, pi0.5): camera wiring, the input processor
around a tokenizer, the role rules of joint layers, and the family's LeRobot-format plumbing.

Each family keeps what is its own: the prompt, the image resize, the network and LeRobot's key
names (`lerobot_key_map`).
"""

from __future__ import annotations

import dataclasses
import re
from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT
from raytrain_vla.common.normalize import ACTION, STATE, Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.base import (
    ACTION_EXPERT,
    BACKBONE,
    ImageHook,
    InputProcessor,
    ModelFamily,
    VLAModel,
    collate_masks,
    encode_targets,
)
from raytrain_vla.models.lerobot_format import affine_stats, is_lerobot_dir, normalizer_from_stats
from raytrain_vla.models.lora import merge_lora

LORA = "lora"  # the role of LoRA adapters (`model.lora`)
# LeRobot's normalisation modes (`NormalizationMode`) by feature type.
LEROBOT_NORM_MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10")
_JOINT = re.compile(r"^layers\.\d+\.(vlm|expert)\.")


def camera_wiring(
    cameras: list[str], mapping: dict[str, str], spec: DataSpec, fixed: bool, key: str
) -> tuple[list[str], list[str]]:
    """(model cameras, the dataset camera feeding each or ""). `fixed`: the model's cameras
    come from a checkpoint; otherwise a fresh model takes the mapping's or the dataset's. `key`
    names the option (`model.<family>.cameras`) in errors."""
    data_cams = spec.camera_keys
    bad = {k: v for k, v in mapping.items() if v not in data_cams}
    if bad:
        raise ValueError(f"'{key}': {bad} name no dataset camera; the dataset has {data_cams}")
    if not fixed:
        cameras = list(mapping) or list(data_cams)
    unknown = [k for k in mapping if k not in cameras]
    if unknown:
        raise ValueError(f"'{key}': {unknown} are not cameras of the model; it has {cameras}")
    sources = [mapping.get(cam, cam if cam in data_cams else "") for cam in cameras]
    if not any(sources):
        raise ValueError(
            f"no dataset camera feeds the model: its cameras are {cameras}, the dataset's "
            f"{data_cams}; map them with {key}={{MODEL_CAMERA: DATASET_CAMERA}}"
        )
    return cameras, sources


def json_safe(value: Any) -> Any:
    """Tuples become lists, recursively (what JSON gives back)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def camera_fields(data: dict[str, Any], pairs: tuple[str, ...] = ()) -> dict[str, Any]:
    """A config dict read from JSON with its camera lists and the named int pairs as tuples."""
    data = dict(data)
    for key in ("cameras", "camera_sources"):
        if key in data:
            data[key] = tuple(str(v) for v in data[key])
    if "camera_shapes" in data:
        data["camera_shapes"] = tuple(tuple(int(s) for s in v) for v in data["camera_shapes"])
    for key in pairs:
        if key in data:
            data[key] = tuple(int(v) for v in data[key])
    return data


class JointLayerModel(VLAModel):
    """A model whose joint layers are `layers.N.vlm` (the VLM's, role backbone) and
    `layers.N.expert` (the action expert's), with LoRA adapters as their own role, trained on
    LeRobot's per-element flow loss."""

    @classmethod
    def role_of(cls, param_name: str) -> str:
        if ".lora_" in param_name:
            return LORA
        joint = _JOINT.match(param_name)
        if joint:
            return BACKBONE if joint.group(1) == "vlm" else ACTION_EXPERT
        return super().role_of(param_name)

    def fresh_parameters(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if self.role_of(name) == LORA}

    @abstractmethod
    def velocity(
        self, batch: dict[str, Any], x_t: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """v(x_t, t) (B, chunk, max_action_dim) with prefix and expert tokens in one pass."""

    def flow_losses(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-element (u_t - v_t)^2 (B, chunk, max_action_dim), as LeRobot's model.forward."""
        actions, noise, time = batch["actions"].float(), noise.float(), time.float()
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        return F.mse_loss(noise - actions, self.velocity(batch, x_t, time), reduction="none")


class LeRobotVLAProcessor(InputProcessor):
    """Cameras as decoded (resized on the device in `collate`), a normalised state padded to
    `max_state_dim`, the family's prompt tokenised right-padded to `tokenizer_max_length`, and
    LeRobot's rule for cameras: one absent from a batch is skipped, or up to `empty_cameras`
    replaced by an empty image. The config needs `cameras`, `camera_sources`, `state_dim`,
    `action_dim`, `max_state_dim`, `max_action_dim`, `tokenizer_max_length`, `empty_cameras`."""

    allows_missing_cameras = True

    def __init__(self, config: Any, normalizer: Normalizer, tokenizer: Any):
        self.config = config
        self.normalizer = normalizer
        wiring = zip(config.cameras, config.camera_sources, strict=True)
        self.sources = {cam: src for cam, src in wiring if src}  # in the model's camera order
        self.camera_keys = list(self.sources.values())
        self.state_dim = config.state_dim
        self.action_dim = config.action_dim
        self.tokenizer = tokenizer

    @abstractmethod
    def prompts(self, tasks: np.ndarray, normalized_state: np.ndarray) -> list[str]:
        """The text LeRobot's preprocessor tokenises for each sample."""

    @abstractmethod
    def prepare_image(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 or [0, 1] float (B, C, H, W) -> the model's [-1, 1] input."""

    def trim_language(
        self, tokens: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's tokens as the model sees them (all `tokenizer_max_length` here)."""
        return tokens, masks

    def tokenize(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ids (N, tokenizer_max_length) right-padded and truncated, bool mask."""
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
        state = self.normalizer.normalize(STATE, cols["state"])
        out["state"] = np.pad(state, ((0, 0), (0, self.config.max_state_dim - state.shape[1])))
        prompts = self.prompts(np.asarray(cols["task"]), state)
        unique, row = np.unique(np.asarray(prompts, dtype=str), return_inverse=True)
        tokens, mask = self.tokenize(unique.tolist())
        out["lang_tokens"], out["lang_masks"] = tokens[row], mask[row]
        return encode_targets(cols, out, self.normalizer)

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
        tokens, lang_masks = self.trim_language(
            t(cols["lang_tokens"]), t(cols["lang_masks"]).bool()
        )
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


class LeRobotVLAFamily(ModelFamily):
    """The LeRobot-format plumbing of a family whose config has `cameras`, `camera_sources`,
    `camera_shapes`, `state_dim`, `action_dim`, `chunk_size` and `lora`."""

    foreign_formats = ("lerobot",)
    supports_lora = True

    @abstractmethod
    def lerobot_key_map(self, model: VLAModel) -> dict[str, str]:
        """{our parameter name: LeRobot's key} for every entry of the state dict but adapters."""

    def checkpoint_keys(self, path: str | Path, model: VLAModel) -> dict[str, str] | None:
        """LeRobot's names for our parameters when `path` is a LeRobot policy directory; under
        LoRA, a wrapped layer's base weight is the plain weight of our (merged) exports."""
        if is_lerobot_dir(path):
            return self.lerobot_key_map(model)
        if model.config.lora:
            return {name: name.replace(".base_layer.", ".") for name in model.state_dict()}
        return None

    def policy_state(
        self, state: dict[str, torch.Tensor], config: Any
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """LoRA adapters merged into their base weights (W + B A alpha / r), so a policy loads
        without peft and runs at the plain model's cost."""
        if not config.lora:
            return state, config
        return merge_lora(state, config.lora), dataclasses.replace(config, lora={})

    @staticmethod
    def policy_spec(config: Any) -> DataSpec:
        """The data shapes a policy read from LeRobot's files expects."""
        wiring = zip(config.camera_sources, config.camera_shapes, strict=True)
        return DataSpec(
            camera_shapes={src: tuple(shape) for src, shape in wiring if src},
            state_dim=config.state_dim,
            action_dim=config.action_dim,
            chunk_size=config.chunk_size,
        )

    @staticmethod
    def lerobot_stats(config: Any, normalizer: Normalizer) -> dict[str, dict[str, np.ndarray]]:
        """The statistics a LeRobot export writes: our dataset cameras under the model's camera
        names; state and action keep theirs."""
        stats = {}
        for cam, src in zip(config.cameras, config.camera_sources, strict=True):
            if src in normalizer.stats:
                stats[cam] = normalizer.stats[src]
            elif cam in normalizer.stats:
                stats[cam] = normalizer.stats[cam]
        for feature in (STATE, ACTION):
            stats[feature] = normalizer.stats.get(feature) or affine_stats(normalizer, feature)
        return stats


def shared_config_problems(config: Any) -> list[str]:
    """What every LeRobot VLA config must satisfy (the family adds its own checks)."""
    problems = []
    if len(config.camera_sources) != len(config.cameras):
        problems.append("camera_sources must name one source per camera")
    if config.n_action_steps > config.chunk_size:
        problems.append(f"n_action_steps {config.n_action_steps} > chunk_size {config.chunk_size}")
    for kind, mode in config.norm_map.items():
        if mode not in LEROBOT_NORM_MODES:
            problems.append(f"norm_map[{kind}] {mode!r}, expected one of {LEROBOT_NORM_MODES}")
    if config.state_dim > config.max_state_dim or config.action_dim > config.max_action_dim:
        problems.append(
            f"state/action dims ({config.state_dim}, {config.action_dim}) exceed max_state_dim/"
            f"max_action_dim ({config.max_state_dim}, {config.max_action_dim})"
        )
    return problems


def lerobot_normalizer(normalizer: Normalizer, norm_map: dict[str, str], family: str) -> Normalizer:
    """The dataset's statistics applied as LeRobot applies them under `norm_map` (mean/std over
    std + 1e-8, quantiles to [-1, 1], ...); statistics the map needs but the dataset lacks are
    an error naming them. A normaliser without state and action statistics is returned as is."""
    if STATE not in normalizer.stats or ACTION not in normalizer.stats:
        return normalizer
    needs = {
        "QUANTILES": ("q01", "q99"),
        "QUANTILE10": ("q10", "q90"),
        "MEAN_STD": ("mean", "std"),
        "MIN_MAX": ("min", "max"),
    }
    for feature, kind in ((STATE, "STATE"), (ACTION, "ACTION")):
        lacking = [s for s in needs.get(norm_map[kind], ()) if s not in normalizer.stats[feature]]
        if lacking:
            raise ValueError(
                f"the dataset's meta/stats.json has no {lacking} for {feature!r}, which "
                f"{family} normalises with {norm_map[kind]}; compute them with "
                "`python -m raytrain_vla.data stats ROOT --force`"
            )
    return normalizer_from_stats(normalizer.stats, norm_map, "the dataset's stats")


def given_options(options: Any, skip: tuple[str, ...]) -> dict[str, Any]:
    """The options the user set (not None), but those in `skip` (paths, camera maps)."""
    return {
        f.name: getattr(options, f.name)
        for f in dataclasses.fields(options)
        if getattr(options, f.name) is not None and f.name not in skip
    }


def refuse_contradictions(
    given: dict[str, Any], base: Any, architecture: tuple[str, ...], family: str, init_from: str
) -> None:
    """An architecture option that differs from the `init_from` checkpoint's is an error."""
    clash = {
        k: (v, getattr(base, k))
        for k, v in given.items()
        if k in architecture and v != getattr(base, k)
    }
    if clash:
        detail = ", ".join(f"{k}={v!r} (checkpoint: {c!r})" for k, (v, c) in clash.items())
        raise ValueError(f"model.{family} options contradict model.init_from={init_from}: {detail}")
