"""What a dataset offers a policy: the shapes a model family sizes itself by.

The data layer fills it from `meta/info.json` and the data config; a family turns it, with its
own options, into its typed model config. It travels with every policy, so evaluation knows
which camera resolution the policy was trained from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DataSpec:
    # (C, H, W) of each camera as decoded from the dataset, in the dataset's feature order.
    camera_shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    state_dim: int = 0
    action_dim: int = 0
    chunk_size: int = 1  # future actions per sample
    # `data.image_size`: the [H, W] a model should see its cameras at; None leaves it to the model.
    image_size: tuple[int, int] | None = None

    @property
    def camera_keys(self) -> list[str]:
        return list(self.camera_shapes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "camera_shapes": {k: list(v) for k, v in self.camera_shapes.items()},
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "chunk_size": self.chunk_size,
            "image_size": list(self.image_size) if self.image_size else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataSpec:
        return cls(
            camera_shapes={k: tuple(int(s) for s in v) for k, v in d["camera_shapes"].items()},
            state_dim=int(d["state_dim"]),
            action_dim=int(d["action_dim"]),
            chunk_size=int(d["chunk_size"]),
            image_size=tuple(int(s) for s in d["image_size"]) if d.get("image_size") else None,
        )
