"""The weights a run starts from: a seeded fresh init, then `model.init_from` if set.

Only rank 0 builds this "init source"; the other ranks receive it by broadcast into their shards
(`train.materialize`). Parameters a run keeps frozen are restored from it on resume and in
`export`, so checkpoints need not carry them.

Keys are matched by name and shape. Anything missing, unexpected or of another shape is an
error naming the file and the keys, unless one of `model.init_allow` (regexes) matches it: those
parameters keep their fresh initialisation, e.g. a new action head for another action dimension.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from raytrain_vla.models.base import ModelFamily
from raytrain_vla.policy.format import WEIGHTS


def weights_file(path: str | Path) -> Path:
    path = Path(path).expanduser()
    file = path / WEIGHTS if path.is_dir() else path
    if not file.is_file() or file.suffix != ".safetensors":
        raise FileNotFoundError(
            f"model.init_from: {path} is neither a policy directory (with {WEIGHTS}) nor a "
            ".safetensors file"
        )
    return file


@torch.no_grad()
def load_pretrained(
    model: nn.Module,
    path: str | Path,
    allow: list[str],
    file_keys: dict[str, str] | None = None,
    fresh: set[str] = frozenset(),
) -> list[str]:
    """Copy matching tensors into `model`, one at a time; return the keys left as initialised.
    `file_keys` maps our parameter names to the file's (another project's checkpoint); `fresh`
    parameters (e.g. LoRA adapters) are in no checkpoint and keep their initialisation."""
    file = weights_file(path)
    own = {k: v for k, v in model.state_dict().items() if k not in fresh}
    if file_keys is not None:  # address our tensors by the file's names
        own = {file_keys.get(k, k): v for k, v in own.items()}
    allowed = [re.compile(p) for p in allow]

    def is_allowed(key: str) -> bool:
        return any(p.search(key) for p in allowed)

    with safe_open(str(file), framework="pt") as f:
        theirs = set(f.keys())
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in theirs & set(own)}
        problems = {
            "missing": sorted(set(own) - theirs),
            "unexpected": sorted(theirs - set(own)),
            "shape differs": sorted(k for k, s in shapes.items() if s != tuple(own[k].shape)),
        }
        refused = {kind: [k for k in keys if not is_allowed(k)] for kind, keys in problems.items()}
        if any(refused.values()):
            detail = "; ".join(f"{kind}: {keys[:4]}" for kind, keys in refused.items() if keys)
            raise ValueError(
                f"model.init_from: {file} does not fit this model ({detail}); name the keys to "
                "re-initialise in model.init_allow (regexes)"
            )
        for key, shape in shapes.items():
            if shape == tuple(own[key].shape):
                own[key].copy_(f.get_tensor(key))
    skipped = problems["missing"] + problems["shape differs"]
    return sorted(skipped)


def build_init_source(
    family: ModelFamily, config, seed: int, init_from: str = "", init_allow: list[str] = ()
) -> nn.Module:
    """Deterministic in (seed, init_from) and independent of the world size; leaves the global
    RNG untouched, so building it on one rank only keeps every rank's RNG stream the same."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = family.build(config)
    family.load_base_weights(model, config)
    if init_from:
        keys = family.checkpoint_keys(init_from, model)
        load_pretrained(model, init_from, list(init_allow), keys, model.fresh_parameters())
    return model
