"""The pi0 family: LeRobot's pi0 (models/pi_gemma) under `model.type=pi0`."""

from __future__ import annotations

from raytrain_vla.models.pi0.options import PI0Options
from raytrain_vla.models.pi_gemma.family import PiFamily


class PI0Family(PiFamily):
    name = "pi0"
    options_type = PI0Options


FAMILY = PI0Family()
