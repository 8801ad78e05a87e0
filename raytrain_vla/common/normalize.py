"""Normalisation of state and actions by the dataset's statistics.

Stats come from the dataset's `meta/stats.json` and travel with checkpoints and exports as
`normalization.json`, so a policy un-normalises its actions without the dataset. The maps work
on numpy arrays (read tasks, float32) and torch tensors alike, with the same float32 result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from raytrain_vla.common.atomic import write_text_atomic
from raytrain_vla.common.features import ACTION, STATE

NORMALIZED_FEATURES = (STATE, ACTION)
ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)
EPS = 1e-6


MODES = ("mean_std", "min_max", "quantile", "quantile10")
# Which stats each mode needs, and the affine map (shift, scale) it builds from them.
_AFFINE = {
    "mean_std": (("mean", "std"), lambda s: (s["mean"], s["std"])),
    "min_max": (("min", "max"), lambda s: ((s["max"] + s["min"]) / 2, (s["max"] - s["min"]) / 2)),
    "quantile": (("q01", "q99"), lambda s: ((s["q99"] + s["q01"]) / 2, (s["q99"] - s["q01"]) / 2)),
    "quantile10": (
        ("q10", "q90"),
        lambda s: ((s["q90"] + s["q10"]) / 2, (s["q90"] - s["q10"]) / 2),
    ),
}


@dataclass
class Normalizer:
    """Per-feature affine maps x_norm = (x - shift) / scale; min_max and quantile map their
    range ([min, max] or [q01, q99]) to [-1, 1]."""

    modes: dict[str, str]
    shift: dict[str, np.ndarray]
    scale: dict[str, np.ndarray]
    # The dataset's raw statistics of the policy's features (LeRobot's stats: mean, std, min,
    # max, q01.., count per feature), kept so a policy can be exported in LeRobot's format.
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def from_stats(
        cls,
        stats: dict,
        mode: str,
        per_feature: dict[str, str] | None = None,
        features=NORMALIZED_FEATURES,
        source: str = "stats",
        keep_stats: tuple[str, ...] = (),
        dims: dict[str, int] | None = None,
    ) -> Normalizer:
        """`keep_stats`: features whose raw statistics travel with the normaliser; `dims`: each
        feature's length, which every statistic it needs must have."""
        modes, shift, scale = {}, {}, {}
        for feat in features:
            modes[feat] = (per_feature or {}).get(feat, mode)
            if modes[feat] not in _AFFINE:
                raise ValueError(
                    f"unknown normalisation mode '{modes[feat]}' for '{feat}', expected {MODES}"
                )
            needed, affine = _AFFINE[modes[feat]]
            have = stats.get(feat, {})
            missing = [k for k in needed if k not in have]
            if missing:
                raise ValueError(
                    f"{source}: '{feat}' has no {missing} (needed by normalisation mode "
                    f"'{modes[feat]}'); run `python -m raytrain_vla.data stats ROOT --force`"
                )
            s = {k: np.asarray(have[k], dtype=np.float32) for k in needed}
            _check_stats(s, feat, (dims or {}).get(feat), source)
            shift[feat], spread = affine(s)
            scale[feat] = np.maximum(spread, EPS).astype(np.float32)
        raw = {
            feat: {k: np.asarray(v, dtype=np.float32) for k, v in stats[feat].items()}
            for feat in keep_stats
            if feat in stats
        }
        return cls(modes, shift, scale, raw)

    def to_dict(self) -> dict:
        return {
            "features": {
                k: {
                    "mode": self.modes[k],
                    "shift": self.shift[k].tolist(),
                    "scale": self.scale[k].tolist(),
                }
                for k in self.shift
            },
            **({"stats": _stats_to_json(self.stats)} if self.stats else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Normalizer:
        feats = d["features"]
        return cls(
            {k: v.get("mode", d.get("mode", "mean_std")) for k, v in feats.items()},
            {k: np.asarray(v["shift"], np.float32) for k, v in feats.items()},
            {k: np.asarray(v["scale"], np.float32) for k, v in feats.items()},
            _stats_from_json(d.get("stats", {})),
        )

    def save(self, path: str | Path) -> None:
        write_text_atomic(Path(path), json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Normalizer:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def _tensors(self, feat: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies: arrays Ray passed to another process are read-only, which torch warns on."""
        return tuple(
            torch.tensor(np.array(v[feat]), device=x.device, dtype=x.dtype)
            for v in (self.shift, self.scale)
        )

    def normalize(self, feat: str, x: ArrayT) -> ArrayT:
        if isinstance(x, np.ndarray):
            return (x.astype(np.float32, copy=False) - self.shift[feat]) / self.scale[feat]
        shift, scale = self._tensors(feat, x)
        return (x - shift) / scale

    def unnormalize(self, feat: str, x: ArrayT) -> ArrayT:
        if isinstance(x, np.ndarray):
            return x.astype(np.float32, copy=False) * self.scale[feat] + self.shift[feat]
        shift, scale = self._tensors(feat, x)
        return x * scale + shift


def _check_stats(stats: dict[str, np.ndarray], feat: str, dim: int | None, source: str) -> None:
    """A NaN std would drop every sample as non-finite and "train" on nothing; a wrong length
    fails later as a bare broadcast error."""
    fix = "recompute them with `python -m raytrain_vla.data stats ROOT --force`"
    for name, values in stats.items():
        if dim is not None and values.shape != (dim,):
            raise ValueError(
                f"{source}: '{feat}' statistic '{name}' has shape {list(values.shape)}, expected "
                f"[{dim}] (the feature's length); {fix}"
            )
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(
                f"{source}: '{feat}' statistic '{name}' is {values.flat[bad[0]]} at index "
                f"{int(bad[0])}, expected a finite number; {fix}"
            )


def _stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    """float32 -> JSON numbers -> float32 is exact, so a round trip keeps every bit."""
    return {
        feat: {k: {"shape": list(v.shape), "values": v.reshape(-1).tolist()} for k, v in s.items()}
        for feat, s in stats.items()
    }


def _stats_from_json(data: dict) -> dict[str, dict[str, np.ndarray]]:
    return {
        feat: {
            k: np.asarray(v["values"], dtype=np.float32).reshape(v["shape"]) for k, v in s.items()
        }
        for feat, s in data.items()
    }
