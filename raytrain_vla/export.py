"""Write a consolidated policy directory that loads without Ray or the training world size.

Layout: `model.safetensors` (full weights), `config.json` (model type and builder arguments,
tasks, chunk size) and `normalization.json`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from raytrain_vla.data.transforms import Normalizer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
NORMALIZATION = "normalization.json"


def write_policy(
    out_dir: Path,
    state_dict: dict[str, torch.Tensor],
    model_type: str,
    model_kwargs: dict,
    normalizer: Normalizer,
    mean_action: np.ndarray,
    tasks: list[str],
    dtype: torch.dtype | None = None,
) -> Path:
    """Write into a staging sibling, then swap it in, so a crash never leaves a half export."""
    out_dir = Path(out_dir)
    staging = out_dir.with_name(f".{out_dir.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tensors = {
        k: (v.to(dtype) if dtype and v.is_floating_point() else v).contiguous()
        for k, v in state_dict.items()
    }
    save_file(tensors, str(staging / WEIGHTS))
    config = {
        "model_type": model_type,
        "model_kwargs": model_kwargs,
        "mean_action": np.asarray(mean_action).tolist(),
        "tasks": tasks,
    }
    (staging / CONFIG).write_text(json.dumps(config, indent=2))
    normalizer.save(staging / NORMALIZATION)
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out_dir)
    return out_dir
