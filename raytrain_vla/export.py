"""Write a consolidated policy directory that loads without Ray or the training world size.

Layout: `model.safetensors` (full weights), `config.json` (model type and builder arguments,
tasks, chunk size) and `normalization.json`.

    python -m raytrain_vla.export CHECKPOINT_DIR OUT_DIR [--dtype bf16]

turns any training checkpoint (DCP shards from any number of workers) into that directory in
one process: the model is allocated once, uninitialised, and DCP reads the shards into it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from raytrain_vla.data.transforms import Normalizer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
NORMALIZATION = "normalization.json"
POLICY_META = "policy.json"  # in training checkpoints: what `config.json` of an export holds
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def policy_meta(model_type: str, model_kwargs: dict, mean_action, tasks: list[str]) -> dict:
    return {
        "model_type": model_type,
        "model_kwargs": model_kwargs,
        "mean_action": np.asarray(mean_action).tolist(),
        "tasks": tasks,
    }


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
    config = policy_meta(model_type, model_kwargs, mean_action, tasks)
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


def export_checkpoint(checkpoint: Path, out_dir: Path, dtype: str = "fp32") -> Path:
    """DCP shards of any world size -> a policy directory, holding one copy of the weights."""
    import torch.distributed.checkpoint as dcp

    from raytrain_vla.models.registry import build_model

    checkpoint = Path(checkpoint)
    for name in (POLICY_META, NORMALIZATION, ".metadata"):
        if not (checkpoint / name).is_file():
            raise FileNotFoundError(
                f"{checkpoint}: not a raytrain_vla training checkpoint (missing {name})"
            )
    meta = json.loads((checkpoint / POLICY_META).read_text())
    with torch.device("meta"):
        model = build_model(meta["model_type"], meta["model_kwargs"])
    stored = _stored_model_keys(checkpoint)
    left_out = set(model.state_dict()) - stored
    if left_out:  # frozen while training: they come from the run's init source
        model = _init_source_of(checkpoint, meta, stored)
    else:
        model = model.to_empty(device="cpu")  # storage only: DCP fills every tensor
    state = model.state_dict()
    dcp.load({"model": {k: state[k] for k in stored}}, checkpoint_id=str(checkpoint))
    target = DTYPES[dtype]
    for key, tensor in state.items():  # one tensor at a time, so never two copies of the model
        if tensor.is_floating_point() and tensor.dtype != target:
            state[key] = tensor.to(target)
    normalizer = Normalizer.from_dict(json.loads((checkpoint / NORMALIZATION).read_text()))
    return write_policy(
        out_dir, state, meta["model_type"], meta["model_kwargs"], normalizer,
        np.asarray(meta["mean_action"]), meta["tasks"],
    )  # fmt: skip


def _stored_model_keys(checkpoint: Path) -> set[str]:
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    prefix = "model."
    return {k[len(prefix) :] for k in metadata.state_dict_metadata if k.startswith(prefix)}


def _init_source_of(checkpoint: Path, meta: dict, stored: set[str]) -> torch.nn.Module:
    """Rebuild the run's init source and prove it still holds the frozen values trained with."""
    import yaml

    from raytrain_vla.config import from_tree
    from raytrain_vla.models.pretrained import build_init_source
    from raytrain_vla.train import checkpoint as ckpt

    config_file = checkpoint / ckpt.CONFIG
    cfg = from_tree(yaml.safe_load(config_file.read_text()), str(config_file))
    source = f"model.init_from={cfg.model.init_from or '(none: seeded init)'}"
    try:
        model = build_init_source(
            meta["model_type"], meta["model_kwargs"], cfg.train.seed,
            cfg.model.init_from, cfg.model.init_allow,
        )  # fmt: skip
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{checkpoint} leaves out its frozen parameters, to be restored from {source}: {err}"
        ) from err
    frozen = [name for name, _ in model.named_parameters() if name not in stored]
    state = ckpt.read_train_state(checkpoint)
    ckpt.check_frozen(state, ckpt.frozen_checksum(model, frozen), source)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.export", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint_* directory of a run")
    parser.add_argument("out", type=Path, help="the policy directory to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.dtype)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {' '.join(str(err).split())[:500]}", file=sys.stderr)
        return 1
    print(f"exported {args.checkpoint} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
