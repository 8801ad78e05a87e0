"""The policy format: one directory that loads without Ray, the dataset or the training world size.

    model.safetensors    full weights, one tensor per parameter name
    config.json          {"format": "raytrain_vla.policy", "version": 2, "model_type",
                          "model_config" (the family's typed config), "data_spec", "tasks",
                          "mean_action"; a mixture's also "embodiments", "layout"}
    normalization.json   the normaliser's per-feature affine maps

Training checkpoints carry the same JSON as `policy.json`, so a checkpoint alone rebuilds its
model. Version 1 stored the model builder's keyword arguments (`model_kwargs`); it is still read.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from raytrain_vla.common.atomic import replacing_directory
from raytrain_vla.common.location import is_uri
from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.run_storage import run_path, upload_directory
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.data.embodiment import Embodiment, MixtureLayout
from raytrain_vla.models.base import FamilyConfig, ModelFamily
from raytrain_vla.models.registry import get_family

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
NORMALIZATION = "normalization.json"
CHECKPOINT_META = "policy.json"  # in a training checkpoint: the export's config.json
FORMAT, VERSION = "raytrain_vla.policy", 2
POLICY_FILES = (WEIGHTS, CONFIG, NORMALIZATION)


@dataclass(frozen=True)
class PolicyMeta:
    """What a policy needs besides its weights and normaliser."""

    model_type: str
    model_config: FamilyConfig
    data_spec: DataSpec
    tasks: tuple[str, ...] = ()
    mean_action: tuple[float, ...] = ()
    # A mixture's datasets (their sizes, cameras and normalisation) and its common layout;
    # the policy then predicts for one of them (`predict_action(..., embodiment=NAME)`).
    embodiments: tuple[Embodiment, ...] = ()
    layout: MixtureLayout | None = None

    def embodiment(self, name: str | None) -> Embodiment | None:
        """The named embodiment of a mixture policy; None for a single-dataset policy, which
        takes no name."""
        if not self.embodiments:
            if name is not None:
                raise ValueError(
                    f"embodiment {name!r} given, but this policy was trained on one dataset"
                )
            return None
        names = [e.name for e in self.embodiments]
        if name not in names:
            raise ValueError(
                f"this policy was trained on a mixture; pass embodiment= one of {names}"
                + ("" if name is None else f", got {name!r}")
            )
        return self.embodiments[names.index(name)]

    @property
    def family(self) -> ModelFamily:
        return get_family(self.model_type)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model_type": self.model_type,
            "model_config": self.model_config.to_dict(),
            "data_spec": self.data_spec.to_dict(),
            "tasks": list(self.tasks),
            "mean_action": [float(v) for v in self.mean_action],
            **(
                {
                    "embodiments": [e.to_dict() for e in self.embodiments],
                    "layout": self.layout.to_dict(),
                }
                if self.layout is not None
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> PolicyMeta:
        """`source` (the file) is named in every error; relative paths in the model config are
        resolved against its directory."""
        try:
            family = get_family(str(data["model_type"]))
            if "model_kwargs" in data:  # version 1
                return cls._from_v1(family, data)
            if data.get("format") != FORMAT or data.get("version") != VERSION:
                got = (data.get("format"), data.get("version"))
                raise ValueError(f"policy format {got}, expected {(FORMAT, VERSION)}")
            return cls(
                family.name,
                family.config_from_dict(data["model_config"], Path(source).parent),
                DataSpec.from_dict(data["data_spec"]),
                tuple(data["tasks"]),
                tuple(float(v) for v in data["mean_action"]),
                tuple(Embodiment.from_dict(e) for e in data.get("embodiments", [])),
                MixtureLayout.from_dict(data["layout"]) if data.get("layout") else None,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}: not a readable policy config ({err!r})") from err

    @classmethod
    def _from_v1(cls, family: ModelFamily, data: dict[str, Any]) -> PolicyMeta:
        kwargs = data["model_kwargs"]
        image_size = tuple(int(s) for s in kwargs["image_size"])
        spec = DataSpec(
            camera_shapes={k: (3, *image_size) for k in kwargs["camera_keys"]},
            state_dim=int(kwargs["state_dim"]),
            action_dim=int(kwargs["action_dim"]),
            chunk_size=int(kwargs["chunk_size"]),
            image_size=image_size,
        )
        config = family.config_from_legacy(kwargs)
        mean = tuple(float(v) for v in data.get("mean_action", []))
        return cls(family.name, config, spec, tuple(data.get("tasks", [])), mean)


def read_meta(path: Path) -> PolicyMeta:
    """A policy's `config.json`, or a checkpoint's `policy.json` when `path` is that file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable policy config ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return PolicyMeta.from_dict(data, str(path))


def check_policy_dir(path: Path) -> None:
    for name in POLICY_FILES:
        if not (Path(path) / name).is_file():
            raise FileNotFoundError(f"{path}: not a policy directory (missing {name})")


def write_policy(
    out_dir: Path | str,
    state_dict: dict[str, torch.Tensor],
    meta: PolicyMeta,
    normalizer: Normalizer,
) -> Path:
    """Written into a staging sibling, then swapped in: a crash never leaves a half export.
    To an object-store URI it is written locally, then uploaded with `config.json` last."""
    if is_uri(out_dir):
        with tempfile.TemporaryDirectory(prefix="raytrain_vla-") as tmp:
            write_policy(Path(tmp) / "policy", state_dict, meta, normalizer)
            upload_directory(Path(tmp) / "policy", run_path(out_dir), last=(CONFIG,))
        return run_path(out_dir)
    out_dir = Path(out_dir)
    state_dict, config = meta.family.policy_state(state_dict, meta.model_config)
    with replacing_directory(out_dir) as staging:
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(staging / WEIGHTS))
        config = meta.family.export_assets(config, staging)
        meta = dataclasses.replace(meta, model_config=config)
        (staging / CONFIG).write_text(json.dumps(meta.to_dict(), indent=2))
        normalizer.save(staging / NORMALIZATION)
    return out_dir
