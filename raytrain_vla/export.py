"""`python -m raytrain_vla.export CHECKPOINT_DIR OUT_DIR [--dtype bf16] [--format lerobot]`: a
policy directory from any training checkpoint (DCP shards from any number of workers), in one
process, without Ray. `--format lerobot` writes LeRobot's `pretrained_model/` layout instead
(for the families LeRobot also has), which LeRobot's `from_pretrained` loads without this package.

The policy format is `raytrain_vla.policy.format`; the checkpoint side is
`raytrain_vla.train.checkpoint.consolidate`. Either directory may be an object-store URI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from raytrain_vla.common.location import is_uri
from raytrain_vla.common.run_storage import local_directory
from raytrain_vla.policy.format import write_policy
from raytrain_vla.train.checkpoint import consolidate

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


FORMATS = ("raytrain", "lerobot")


def export_checkpoint(
    checkpoint: Path | str, out_dir: Path | str, dtype: str = "fp32", fmt: str = "raytrain"
) -> Path:
    """A checkpoint in object storage is downloaded first; the policy may go to a URI too.
    A damaged checkpoint (its files differ from its manifest) raises before `out_dir` is
    touched, so an existing export stays as it was."""
    if fmt != "raytrain" and is_uri(out_dir):
        raise ValueError(f"{out_dir}: --format {fmt} writes a local directory; give a path")
    with local_directory(checkpoint) as local:
        shown_as = str(checkpoint) if is_uri(checkpoint) else None
        state, meta, normalizer = consolidate(local, DTYPES[dtype], shown_as)
    if fmt == "raytrain":
        return write_policy(out_dir, state, meta, normalizer)
    if fmt not in meta.family.foreign_formats:
        raise ValueError(
            f"{checkpoint}: model type {meta.model_type!r} cannot be exported as {fmt!r} "
            f"(it writes {('raytrain', *meta.family.foreign_formats)})"
        )
    if meta.embodiments:
        raise ValueError(
            f"{checkpoint}: trained on a mixture of {[e.name for e in meta.embodiments]}; "
            f"{fmt!r} holds one robot's normalisation, so export it as 'raytrain'"
        )
    return meta.family.write_foreign(fmt, out_dir, state, meta.model_config, normalizer)


def _path(text: str) -> Path | str:
    """A URI stays a string (`Path` would fold its `//`)."""
    return text if is_uri(text) else Path(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.export", description=__doc__)
    parser.add_argument("checkpoint", type=_path, help="a checkpoint_* directory of a run (or URI)")
    parser.add_argument("out", type=_path, help="the policy directory to write (or URI)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--format", choices=FORMATS, default="raytrain", dest="fmt")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.dtype, args.fmt)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {' '.join(str(err).split())[:500]}", file=sys.stderr)
        return 1
    print(f"exported {args.checkpoint} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
