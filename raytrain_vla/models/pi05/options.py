"""`model.pi05`: LeRobot's pi0.5: the expert's norms are conditioned on the flow time (adaRMS); the state enters the prompt as 256-bin tokens."""

from __future__ import annotations

from dataclasses import dataclass

from raytrain_vla.models.pi_gemma.options import PiOptions


@dataclass(frozen=True)
class PI05Options(PiOptions):
    """`model.pi05`: LeRobot's pi0.5: the expert's norms are conditioned on the flow time (adaRMS); the state enters the prompt as 256-bin tokens (models/pi_gemma). Start from a LeRobot checkpoint with
    `model.init_from`; options left empty take the checkpoint's value, else LeRobot's."""


OPTIONS = PI05Options  # what models/registry.py registers
