"""The model-family contract: all that the trainer, export, the policy and evaluation know of a model.

A family (`ModelFamily`) brings three things:

* **a typed, frozen config** (`config_type`): its options (the config tree's `model.<name>`
  section) resolved against the dataset's `DataSpec`. A policy's `config.json` stores it.
* **a model** (`VLAModel`): the flow-matching loss and sampler, the modules FSDP shards, and the
  role of every parameter (LR groups and freezing name roles, never parameter prefixes).
* **an input processor** (`InputProcessor`): dataset columns or one observation in, model inputs
  out, and model actions back to the robot's units. Ray Data read tasks and
  `Policy.predict_action` call the same object, so inference cannot drift from training.

Flow noise and time come from the trainer's keyed generator (`train/noise.py`), shaped by
`VLAModel.noise_shape`, so the determinism contract holds for every family. The root module is
sharded last and its inputs are never cast: a model keeps what must stay fp32 (flow time, noise,
the Euler state) in fp32 and casts what its layers consume.

`models/registry.py` maps `model.type` to a family; nothing outside `models/` names a family's
modules or parameters.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from raytrain_vla.common.features import ACTION_DIM_MASK, EMBODIMENT, IMAGE_MASK
from raytrain_vla.common.normalize import ACTION, Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config.families import FamilyOptions

# Runs on the uint8 (N, C, H, W) camera images inside `encode`: the data pipeline's keyed
# augmentation. The family decides at which resolution it applies.
ImageHook = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

# Role names families share, so that default LR groups and options mean the same everywhere.
VISION, LANGUAGE, BACKBONE, ACTION_EXPERT, ADAPTER = (
    "vision", "language", "backbone", "action_expert", "adapter"
)  # fmt: skip


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A copy of `data` for `cls(**...)`; keys that are not fields of the dataclass are an error
    naming them and the valid ones (a policy's `config.json` from another version)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys: {sorted(names)}")
    return dict(data)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A flat frozen config as JSON-safe values (tuples become lists), for `config.json`."""
    return {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()
    }


def encode_targets(
    cols: dict[str, np.ndarray], out: dict[str, np.ndarray], normalizer: Normalizer
) -> dict[str, np.ndarray]:
    """The training columns every processor passes on: sample ids, normalised actions, pads,
    and a mixture's masks and embodiment (`data/embodiment.py`)."""
    if "sample_id" in cols:
        out["sample_id"] = cols["sample_id"]
    for key, value in cols.items():
        if key in (ACTION_DIM_MASK, EMBODIMENT) or key.startswith(IMAGE_MASK):
            out[key] = value
    if "actions" in cols:
        out["actions"] = normalizer.normalize(ACTION, cols["actions"])
        out["action_is_pad"] = cols["action_is_pad"]
    return out


def collate_masks(
    cols: dict[str, np.ndarray], to_tensor: Callable[[np.ndarray], torch.Tensor]
) -> dict[str, Any]:
    """A mixture's per-sample masks as model inputs: `image_masks` (camera -> (B,) bool),
    `action_dim_mask` (B, A) bool and `embodiment` (B,); nothing for a single dataset."""
    batch: dict[str, Any] = {}
    cams = {
        k[len(IMAGE_MASK) :]: to_tensor(v).bool()
        for k, v in cols.items()
        if k.startswith(IMAGE_MASK)
    }
    if cams:
        batch["image_masks"] = cams
    if ACTION_DIM_MASK in cols:
        batch[ACTION_DIM_MASK] = to_tensor(cols[ACTION_DIM_MASK]).bool()
    if EMBODIMENT in cols:
        batch[EMBODIMENT] = to_tensor(cols[EMBODIMENT]).long()
    return batch


class FamilyConfig(Protocol):
    """A frozen dataclass that round-trips through JSON (a policy's `config.json`)."""

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FamilyConfig: ...


class InputProcessor(ABC):
    """Model inputs from dataset columns; the same object in read tasks and at inference.

    `encode` columns in: `image/<camera>` uint8 (N, C, H, W) as decoded, `state` (N, S) in the
    robot's units, `task` (N,) instruction strings; for training also `sample_id` (N,),
    `actions` (N, chunk, A) in the robot's units and `action_is_pad` (N, chunk).
    """

    camera_keys: list[str]
    state_dim: int
    action_dim: int  # the robot's, as `decode_actions` returns it
    # Whether an observation may leave cameras out (LeRobot's SmolVLA skips or pads them).
    allows_missing_cameras: bool = False
    # The (H, W) `encode` resizes every camera to with `image_ops.resize_images`, if it does: read
    # tasks then resize each frame as it is decoded (same pixels, model-size frames in memory,
    # larger tasks) and `encode`'s resize finds nothing to do. None: frames arrive as decoded.
    frame_size: tuple[int, int] | None = None

    @abstractmethod
    def encode(
        self, cols: dict[str, np.ndarray], augment: ImageHook | None = None
    ) -> dict[str, np.ndarray]:
        """Per-sample CPU work (resize, tokenize, normalise): numpy columns in and out, so Ray
        Data can ship them. Keeps `sample_id`, `actions` and `action_is_pad` (model space)."""

    @abstractmethod
    def collate(self, cols: dict[str, np.ndarray], device: torch.device | str) -> dict[str, Any]:
        """A micro-batch of encoded columns -> the model's batch on `device`. The trainer reads
        `sample_ids`, `actions` and `action_is_pad` from it; the rest is the family's."""

    @abstractmethod
    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Model-space actions (B, chunk, A_model) -> the robot's units (B, chunk, action_dim)."""


class VLAModel(nn.Module, ABC):
    """A policy trained by flow matching; `forward` is the per-sample loss."""

    # Role -> parameter-name prefixes. Every parameter has exactly one role.
    ROLE_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {}

    @abstractmethod
    def forward(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Per-sample flow-matching loss (B,) over valid chunk positions."""

    def compute_loss(
        self, batch: dict[str, Any], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """openpi's name for the loss; goes through `__call__` so FSDP2's hooks fire."""
        return self(batch, noise, time)

    @abstractmethod
    def sample_actions(self, batch: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """Model-space actions (B, *noise_shape) integrated from `noise`.

        The trainer registers it with FSDP2 (`register_fsdp_forward_method`)."""

    @property
    @abstractmethod
    def noise_shape(self) -> tuple[int, int]:
        """(chunk, action dim in model space) of one sample's flow noise."""

    @abstractmethod
    def fsdp_units(self) -> list[nn.Module]:
        """The modules to `fully_shard`, in forward order: the repeated blocks and any other
        large submodule. The trainer shards the root last."""

    def fresh_parameters(self) -> set[str]:
        """Parameters no pretrained checkpoint holds (e.g. LoRA adapters): `model.init_from`
        leaves them as initialised."""
        return set()

    def frozen_parameters(self) -> set[str]:
        """Parameters the model's own config keeps frozen (e.g. LeRobot's freezing options);
        the trainer adds the roles `optimizer.freeze_roles` names."""
        return set()

    def activation_checkpoint_units(self) -> list[nn.Module]:
        """Modules whose forward activation checkpointing wraps (the repeated blocks)."""
        return self.fsdp_units()

    @classmethod
    def role_of(cls, param_name: str) -> str:
        for role, prefixes in cls.ROLE_PREFIXES.items():
            if param_name.startswith(prefixes):
                return role
        raise ValueError(
            f"{cls.__name__}: parameter {param_name!r} has no role; ROLE_PREFIXES must cover "
            "every parameter"
        )


@dataclass(frozen=True)
class PolicyFiles:
    """A policy read from another project's format: full weights under our names, its config,
    the data shapes it expects and its normaliser."""

    state: dict[str, torch.Tensor]
    config: FamilyConfig
    spec: DataSpec
    normalizer: Normalizer


@dataclass(frozen=True)
class InputBudget:
    """What the model sees of one sample, for the checks that run before Ray starts."""

    image_size: tuple[int, int]  # (H, W) every camera is brought to before the vision tower
    tokens_per_camera: int  # vision tokens one camera frame becomes
    pixels_per_token: int  # side of the square one token covers (to suggest an image size)
    text_budget: int  # instruction length the model keeps, in `text_unit`
    text_budget_key: str  # the option that sets it, e.g. `model.<family>.max_text_len`
    text_unit: str  # "bytes" or "tokens"
    count_text: Callable[[str], int]  # an instruction's length in `text_unit`, untruncated


class ModelFamily(ABC):
    """One VLA family: its config, its model and its processor (see the module docstring)."""

    name: ClassVar[str]
    # The options section `model.<name>` (registered with the config by `register_family`).
    options_type: ClassVar[type[FamilyOptions]]
    config_type: ClassVar[type[FamilyConfig]]
    model_type: ClassVar[type[VLAModel]]
    # Other projects' policy formats the family reads (`read_foreign`) and writes.
    foreign_formats: ClassVar[tuple[str, ...]] = ()
    supports_lora: ClassVar[bool] = False  # `model.lora` (LoRA adapters)
    uses_data_image_size: ClassVar[bool] = True  # else `data.image_size` is refused

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.model_type.ROLE_PREFIXES)

    @abstractmethod
    def resolve_config(
        self, options: Any, spec: DataSpec, init_from: str = "", lora: Any = None
    ) -> FamilyConfig:
        """The typed model config from the family's options (`model.<name>`), the data, the
        checkpoint `model.init_from` names (families that read other formats) and `model.lora`
        (families that support it)."""

    def build(self, config: FamilyConfig) -> VLAModel:
        """A freshly initialised model (random under the caller's RNG); works on `meta`."""
        return self.model_type(config)

    @abstractmethod
    def processor(self, config: FamilyConfig, normalizer: Normalizer) -> InputProcessor: ...

    def config_from_dict(self, data: dict[str, Any], base_dir: Path | None = None) -> FamilyConfig:
        """Inverse of the config's `to_dict` (a policy's `config.json`); `base_dir` (the policy
        directory) resolves the relative paths `export_assets` wrote."""
        return self.config_type.from_dict(data)

    def tiny_options(self, fixtures: Path | None) -> FamilyOptions:
        """Options of a tiny instance (CPU, about a second to build) on which the contract suite
        runs every family; `fixtures` is the shared fixtures folder (None when absent) for a
        family whose tiny instance needs files, e.g. a VLM's config and tokenizer."""
        raise NotImplementedError(f"model type {self.name!r} has no tiny_options")

    def check_options(self, options: Any, init_from: str = "", lora: Any = None) -> None:
        """What can be checked of the options before Ray starts (without the dataset); raises
        ValueError naming the key. Nothing by default."""
        return None

    def input_budget(self, config: FamilyConfig) -> InputBudget | None:
        """Tokens per camera and the text budget of a resolved config, for the preflight
        checks; None (the default) skips those checks."""
        return None

    def notes(self, config: FamilyConfig) -> list[str]:
        """Lines rank 0 prints when a run starts: conversions the config implies (nothing is
        converted silently)."""
        return []

    def load_base_weights(self, model: VLAModel, config: FamilyConfig) -> list[str]:
        """Pretrained weights the config itself names (e.g. a VLM directory), loaded into a
        fresh model before `model.init_from`; returns the parameters loaded."""
        return []

    def checkpoint_keys(self, path: str | Path, model: VLAModel) -> dict[str, str] | None:
        """{our parameter name: key in the file} for a `model.init_from` in another project's
        format; None when the names are ours."""
        return None

    def policy_state(
        self, state: dict[str, torch.Tensor], config: FamilyConfig
    ) -> tuple[dict[str, torch.Tensor], FamilyConfig]:
        """The weights and config a policy is written with (e.g. LoRA adapters merged)."""
        return state, config

    def export_assets(self, config: FamilyConfig, out_dir: Path) -> FamilyConfig:
        """Copy the files the config refers to into a policy directory; the config to store."""
        return config

    def read_foreign(self, path: Path, options: dict[str, Any] | None = None) -> PolicyFiles | None:
        """A policy directory in one of `foreign_formats`, or None if `path` is none of them.
        `options` (from `policy.load`): what the directory does not hold, e.g. a tokenizer."""
        return None

    def write_foreign(
        self,
        fmt: str,
        out_dir: Path,
        state: dict[str, torch.Tensor],
        config: FamilyConfig,
        normalizer: Normalizer,
    ) -> Path:
        raise ValueError(f"model type {self.name!r} exports no other format than ours ({fmt!r})")

    def config_from_legacy(self, builder_kwargs: dict[str, Any]) -> FamilyConfig:
        """The config of a policy written before typed configs (format 1: builder kwargs)."""
        raise ValueError(f"model type {self.name!r} has no format-1 policies to read")
