"""One robot's data in a mixture's common layout, and back.

A mixture trains one model on robots with different state and action sizes and cameras (as
Physical Intelligence's VLAs pad every robot to one action size). Each dataset (embodiment) keeps its own normalisation;
its normalised state and actions are zero-padded to the mixture's largest sizes, with
`action_dim_mask` saying which action dimensions are the robot's (the loss counts only those),
and a camera it lacks is an all-zero image with `image_mask/<camera>` false (the model ignores
it), never a silent zero. Read tasks and `Policy.predict_action(embodiment=...)` call the same
functions, so inference sees exactly what training saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raytrain_vla.common.features import ACTION, ACTION_DIM_MASK, EMBODIMENT, IMAGE_MASK, STATE
from raytrain_vla.common.image_ops import resize_images
from raytrain_vla.common.normalize import Normalizer


@dataclass(frozen=True)
class MixtureLayout:
    """What every sample of a mixture looks like: the largest sizes and all cameras."""

    state_dim: int
    action_dim: int
    camera_keys: tuple[str, ...]
    image_hw: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "camera_keys": list(self.camera_keys),
            "image_hw": list(self.image_hw),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MixtureLayout:
        return cls(
            int(d["state_dim"]), int(d["action_dim"]), tuple(d["camera_keys"]),
            tuple(int(s) for s in d["image_hw"]),
        )  # fmt: skip


@dataclass(frozen=True)
class Embodiment:
    """One dataset of a mixture: its sizes, cameras and normalisation."""

    name: str
    index: int
    state_dim: int
    action_dim: int
    camera_keys: tuple[str, ...]
    normalizer: Normalizer
    mean_action: tuple[float, ...]  # in the robot's units (the validation baseline)
    tasks: tuple[str, ...] = ()
    root: str = ""  # where the dataset was read from (a record; never opened by a policy)
    fingerprint: str = ""  # the dataset's fingerprint when it was trained on

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "camera_keys": list(self.camera_keys),
            "normalization": self.normalizer.to_dict(),
            "mean_action": [float(v) for v in self.mean_action],
            "tasks": list(self.tasks),
            "root": self.root,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Embodiment:
        return cls(
            str(d["name"]), int(d["index"]), int(d["state_dim"]), int(d["action_dim"]),
            tuple(d["camera_keys"]), Normalizer.from_dict(d["normalization"]),
            tuple(float(v) for v in d["mean_action"]), tuple(d.get("tasks", ())),
            str(d.get("root", "")), str(d.get("fingerprint", "")),
        )  # fmt: skip

    def lean(self) -> Embodiment:
        """Without the raw statistics and tasks: what a read task needs, a few hundred bytes."""
        norm = Normalizer(self.normalizer.modes, self.normalizer.shift, self.normalizer.scale)
        return Embodiment(
            self.name, self.index, self.state_dim, self.action_dim, self.camera_keys, norm,
            self.mean_action,
        )  # fmt: skip

    # -- robot -> model ----------------------------------------------------------------------
    def to_layout(
        self, cols: dict[str, np.ndarray], layout: MixtureLayout
    ) -> dict[str, np.ndarray]:
        """This robot's columns (as a source reads them, or an observation) in the mixture's
        layout: normalised and padded state/actions with masks, every camera at the layout's
        size, the ones it lacks zero and masked off."""
        n = len(cols["state"])
        out = {k: v for k, v in cols.items() if not k.startswith("image/")}
        out.pop("task_index", None)
        state = self.normalizer.normalize(STATE, np.asarray(cols["state"], np.float32))
        out["state"] = _pad_last(state, layout.state_dim)
        if "actions" in cols:
            actions = self.normalizer.normalize(ACTION, np.asarray(cols["actions"], np.float32))
            out["actions"] = _pad_last(actions, layout.action_dim)
        out[ACTION_DIM_MASK] = np.broadcast_to(
            np.arange(layout.action_dim) < self.action_dim, (n, layout.action_dim)
        ).copy()
        out[EMBODIMENT] = np.full(n, self.index, np.int64)
        present = {k: cols[f"image/{k}"] for k in self.camera_keys if f"image/{k}" in cols}
        present = resize_images(present, layout.image_hw)
        for key in layout.camera_keys:
            if key in present:
                out[f"image/{key}"] = present[key]
            else:
                out[f"image/{key}"] = np.zeros((n, 3, *layout.image_hw), np.uint8)
            out[f"{IMAGE_MASK}{key}"] = np.full(n, key in present)
        return out

    # -- model -> robot ----------------------------------------------------------------------
    def robot_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Model-space (normalised, padded) actions -> this robot's units and size."""
        return self.normalizer.unnormalize(ACTION, actions[..., : self.action_dim].float())


def _pad_last(x: np.ndarray, size: int) -> np.ndarray:
    pad = [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])]
    return np.pad(x.astype(np.float32, copy=False), pad)


def identity_normalizer(layout: MixtureLayout) -> Normalizer:
    """The model-side normaliser of a mixture: each robot's columns arrive normalised."""
    dims = {STATE: layout.state_dim, ACTION: layout.action_dim}
    return Normalizer(
        {k: "mean_std" for k in dims},
        {k: np.zeros(d, np.float32) for k, d in dims.items()},
        {k: np.ones(d, np.float32) for k, d in dims.items()},
    )


class EmbodimentActions:
    """The processor's action view for one embodiment (validation in the robot's units)."""

    def __init__(self, embodiment: Embodiment):
        self.embodiment = embodiment
        self.action_dim = embodiment.action_dim

    def decode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.embodiment.robot_actions(actions)
