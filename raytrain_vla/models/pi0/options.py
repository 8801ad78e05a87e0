"""`model.pi0`: LeRobot's pi0: PaliGemma + a Gemma action expert; the state enters as a token of the expert stream."""

from __future__ import annotations

from dataclasses import dataclass

from raytrain_vla.models.pi_gemma.options import PiOptions


@dataclass(frozen=True)
class PI0Options(PiOptions):
    """`model.pi0`: LeRobot's pi0: PaliGemma + a Gemma action expert; the state enters as a token of the expert stream (models/pi_gemma). Start from a LeRobot checkpoint with
    `model.init_from`; options left empty take the checkpoint's value, else LeRobot's."""


OPTIONS = PI0Options  # what models/registry.py registers
