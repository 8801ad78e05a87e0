"""`model.toy_mlp`: the options of the toy MLP family, as the config tree holds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from raytrain_vla.config.families import FamilyOptions


@dataclass(frozen=True)
class ToyMLPOptions(FamilyOptions):
    """`model.toy_mlp`: an MLP flow policy without language (models/toy_mlp), for tests and as
    the template of a new family."""

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 8

    hidden: int = 64  # width of every layer
    pool: int = 8  # each camera is average-pooled to pool x pool before the first layer
    num_inference_steps: int = 4  # Euler steps of the flow at inference

    def check(self, key: str) -> None:
        for name in ("hidden", "pool", "num_inference_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"bad value for '{key}.{name}': {getattr(self, name)}, expected a positive "
                    "integer"
                )


OPTIONS = ToyMLPOptions  # what models/registry.py registers
