"""The pi05 family: LeRobot's pi05 (models/pi_gemma) under `model.type=pi05`."""

from __future__ import annotations

from raytrain_vla.models.pi05.options import PI05Options
from raytrain_vla.models.pi_gemma.family import PiFamily


class PI05Family(PiFamily):
    name = "pi05"
    options_type = PI05Options


FAMILY = PI05Family()
