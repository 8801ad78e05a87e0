"""`raytrain-vla plan-memory [--config CFG.yaml] [--KEY=VALUE ...] [--gpu-memory-gb 80]
[--world-sizes 1,2,4] [--json]`: the GPU memory each rank of a run needs, before renting GPUs.

Takes the same config and overrides as `train`. For each world size (default: every one
`ray.num_workers` allows) on its mesh (`train.dp_shard`): the trained parameters, gradients and
optimizer state (AdamW's two moments, Muon's one buffer) a rank keeps, the frozen weights (replicated or sharded as the trainer will place
them, a rank holding --gpu-memory-gb), the units FSDP2 gathers, one micro-batch's activations
with and without activation checkpointing, counted on the model itself, and the optimizer
step's transient; then whether the total fits. GB = 1e9 bytes. Ray is not started and nothing
trains; the dataset must exist (`data.root=demo` is written on first use, as `train` does).
How the terms are computed: `raytrain_vla/train/memory_plan.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing

from raytrain_vla.cli import fail
from raytrain_vla.config import ConfigError, absolute_paths, dataset_configs, parse_cli
from raytrain_vla.config.help import format_config_help, wants_help
from raytrain_vla.data.demo import ensure_dataset
from raytrain_vla.models.checks import check_model_options
from raytrain_vla.train.memory_plan import GB, MemoryPlan, RunPlan, plan_run, run_world_sizes

USAGE = (
    "raytrain-vla plan-memory [--config CFG.yaml] [--KEY=VALUE ...] [--gpu-memory-gb GB] "
    "[--world-sizes N,N,...] [--json]"
)
OPTIONS = [
    ("--gpu-memory-gb GB", "one GPU's memory in GB (1e9 bytes); default 80"),
    ("--world-sizes N,N,...", "world sizes to plan (default: those ray.num_workers allows)"),
    ("--json", "print the plan as one JSON object"),
]


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"{message} (see --help)")


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.strip("[]").split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 1,2,4")
    return sizes


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of GB")
    return value


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options; the rest are `--config` and config overrides."""
    parser = _OneLineErrors(prog="raytrain-vla plan-memory", add_help=False, allow_abbrev=False)
    parser.add_argument("--gpu-memory-gb", type=_positive, default=80.0)
    parser.add_argument("--world-sizes", type=_world_sizes, default=None)
    parser.add_argument("--json", action="store_true")
    return parser.parse_known_args(argv)


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB"


def format_plan(run: RunPlan, gpu_memory_gb: float, checkpointing: bool) -> str:
    """One table per world size, then whether it fits."""
    acts = run.activations
    lines = [
        f"{run.model_type}: {run.params:,} parameters ({run.trained:,} trained, "
        f"{run.frozen:,} frozen), micro-batch {run.micro_batch}",
        f"activations of one micro-batch: {_gb(acts.plain)}, {_gb(acts.checkpointed)} with "
        f"activation checkpointing (counted on {acts.measured_on}; "
        f"train.activation_checkpointing={str(checkpointing).lower()})",
    ]
    for p in run.plans:
        lines += ["", *_table(p, gpu_memory_gb)]
    lines += [
        "",
        "total = params + grads + optimizer + frozen + max(gathered + activations, optimizer "
        "step); GB = 1e9 bytes",
    ]
    return "\n".join(lines)


def _table(p: MemoryPlan, gpu_memory_gb: float) -> list[str]:
    other = "with" if p.activations == p.activations_plain else "without"
    other_bytes = p.activations_checkpointed if other == "with" else p.activations_plain
    rows = [
        ("params (fp32 shards)", p.params, ""),
        ("grads (fp32 shards)", p.grads, ""),
        ("optimizer state (fp32 shards)", p.optimizer, ""),
        (f"frozen ({p.frozen_placement})", p.frozen, ""),
        ("gathered units", p.gathered, f"{p.precision}"),
        ("activations", p.activations, f"{_gb(other_bytes)} {other} checkpointing"),
        ("optimizer step (transient)", p.step_transient, ""),
    ]
    if p.host:
        rows.append(("in host memory (cpu_offload)", p.host, "not in the total"))
    out = [f"world size {p.world_size}: mesh {p.replicate} x {p.shard} (replicate x shard)"]
    out += [
        f"  {name:<32}{_gb(b):>10}" + (f"   ({note})" if note else "") for name, b, note in rows
    ]
    out.append(f"  {'total per rank':<32}{_gb(p.total):>10}")
    out += [f"  note: {n}" for n in p.notes]
    out.append(f"fits in {gpu_memory_gb:g} GB: {'yes' if p.fits else 'no'} (total {_gb(p.total)})")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(format_config_help(USAGE, __doc__ or "", OPTIONS), end="")
        return 0
    try:
        args, rest = parse_args(argv)
        cfg = absolute_paths(parse_cli(rest))
        check_model_options(cfg.model, cfg.optimizer)
        for one in dataset_configs(cfg.data):
            ensure_dataset(one)
        world_sizes = args.world_sizes or run_world_sizes(cfg)
        run = plan_run(cfg, world_sizes, args.gpu_memory_gb)
    except ConfigError as err:
        return fail(err, 2)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        return fail(err, 1)
    if args.json:
        out = dataclasses.asdict(run)
        out["gpu_memory_gb"] = args.gpu_memory_gb
        print(json.dumps(out))
    else:
        print(format_plan(run, args.gpu_memory_gb, cfg.train.activation_checkpointing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
