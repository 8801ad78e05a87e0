"""Exported policies: `load(DIR).predict_action(obs)`; the on-disk format is in `format.py`."""

from raytrain_vla.policy.runtime import Policy, from_state, load

__all__ = ["Policy", "from_state", "load"]
