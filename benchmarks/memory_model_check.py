"""The memory model of `raytrain-vla plan-memory` against the peak memory of real training steps.

For each size (flow_vla at two widths and depths on the demo dataset, fp32, the trainer's
default LR groups, AdamW and gradient clipping), a fresh process records its resident memory
after the imports and the dataset (the baseline), then builds the model on CPU, runs `--steps`
training steps through `StepRunner` (one plain process: no Ray, no FSDP) and reads its peak
resident memory (VmHWM). Measured is that peak minus the baseline; predicted is
`train/memory_plan.plan` for world size 1 without FSDP: params + grads + AdamW state + the
larger of the activations (counted by `measure_activations`) and the optimizer step's
transient. The first step allocates AdamW's state after its backward, so the peak with that
state held needs a second step.

Each size is measured twice: with glibc's defaults, and with `MALLOC_MMAP_THRESHOLD_=65536`,
under which every buffer of 64 KiB or more is its own mapping, handed back when freed, so the
peak follows the bytes alive (the plan's quantity) rather than what the heap keeps after frees.

    python benchmarks/memory_model_check.py                     # small and medium, 6 minutes
    python benchmarks/memory_model_check.py --sizes small_ac,medium_frozen_backbone
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from raytrain_vla.config import absolute_paths, parse_cli
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.data.demo import ensure_dataset
from raytrain_vla.data.mixture import open_view
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.fsdp import apply_activation_checkpointing
from raytrain_vla.train.memory_plan import GB, example_micro_batch, measure_activations, plan
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.step import StepRunner

FAMILY = "flow_vla"
MMAP_THRESHOLD = "65536"


@dataclasses.dataclass(frozen=True)
class Size:
    preset: str  # flow_vla's size preset
    dims: dict  # over the preset
    micro_batch: int
    activation_checkpointing: bool = False
    freeze_roles: tuple[str, ...] = ()


MEDIUM = {"backbone_layers": 4, "expert_layers": 4}
# Each well above the ~0.46 GB baseline.
SIZES = {
    "small": Size("small", {}, 192),  # 30M parameters: the activations dominate
    "medium": Size("base", MEDIUM, 16),  # 301M: the state and the optimizer step dominate
    "small_ac": Size("small", {}, 192, activation_checkpointing=True),
    "medium_frozen_backbone": Size("base", MEDIUM, 16, freeze_roles=("backbone",)),
}
DEFAULT_SIZES = "small,medium"


def setup(name: str):
    """The demo dataset's view, the family, the model config and processor of size `name`."""
    cfg = absolute_paths(parse_cli([f"--model.type={FAMILY}"]))
    ensure_dataset(cfg.data)
    view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    size = SIZES[name]
    family = get_family(FAMILY)
    options = dataclasses.replace(cfg.model.options, size=size.preset)
    config = dataclasses.replace(family.resolve_config(options, view.spec), **size.dims)
    processor = family.processor(config, view.normalizer)
    optim_cfg = OptimizerConfig(freeze_roles=list(size.freeze_roles))
    return view, family, config, processor, size, optim_cfg


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(name: str, steps: int) -> dict:
    """In a fresh process: peak resident memory of `steps` training steps over the baseline."""
    view, family, config, processor, size, optim_cfg = setup(name)
    baseline = status_bytes("VmRSS")
    torch.manual_seed(0)
    model = family.build(config)
    freeze_for_config(model, optim_cfg)
    if size.activation_checkpointing:
        apply_activation_checkpointing(model.activation_checkpoint_units())
    groups = resolve_groups(model, optim_cfg)
    optimizer = build_optimizer(model, groups, optim_cfg)
    scheduler = build_scheduler(optimizer, steps, SchedulerConfig())

    def noise_fn(step: int, ids: list[int]):
        return flow_noise_and_time(0, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)
    batch = example_micro_batch(processor, view.spec, view.tasks, size.micro_batch)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        runner.run(step, [batch])
        times.append(round(time.perf_counter() - start, 1))
    peak = status_bytes("VmHWM")
    return {"baseline_gb": baseline / GB, "measured_gb": (peak - baseline) / GB, "step_s": times}


def predict(name: str) -> dict:
    """The plan for world size 1 without FSDP, from the meta model (nothing allocated but
    what the activation count's forward needs)."""
    view, family, config, processor, size, optim_cfg = setup(name)
    with torch.device("meta"):
        model = family.build(config)
    frozen = freeze_for_config(model, optim_cfg)
    groups = resolve_groups(model, optim_cfg)
    batch = example_micro_batch(processor, view.spec, view.tasks, size.micro_batch)
    acts = measure_activations(model, batch, "fp32", size.micro_batch)
    train = TrainConfig(
        micro_batch_size=size.micro_batch,
        global_batch_size=size.micro_batch,
        activation_checkpointing=size.activation_checkpointing,
    )
    result = plan(model, frozen, train, 1, acts, groups=groups, fsdp=False)
    terms = ("params", "grads", "optimizer", "frozen", "activations", "step_transient", "total")
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "params_frozen": sum(model.get_parameter(n).numel() for n in frozen),
        "micro_batch": size.micro_batch,
        "activation_checkpointing": size.activation_checkpointing,
        "activations_counted_on": acts.measured_on,
        "predicted_gb": {k: round(getattr(result, k) / GB, 3) for k in terms},
    }


def run_child(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if out.returncode:
        raise RuntimeError(f"{args}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(name: str, steps: int) -> dict:
    """Predicted against measured for one size, in fresh processes."""
    row = run_child(["--child", "predict", "--sizes", name])
    total = row["predicted_gb"]["total"]
    measure_args = ["--child", "measure", "--sizes", name, "--steps", str(steps)]
    allocators = {
        "glibc_default": {},
        "mmap_threshold_64k": {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD},
    }
    for label, env in allocators.items():
        measured = run_child(measure_args, env)
        row[label] = {
            **measured,
            "predicted_over_measured": round(total / measured["measured_gb"], 3),
        }
        print(f"{name} {label}: {json.dumps(row[label])}", file=sys.stderr, flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated: {list(SIZES)}")
    parser.add_argument("--steps", type=int, default=2, help="training steps measured (>= 2)")
    parser.add_argument("--child", choices=["measure", "predict"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    if set(sizes) - set(SIZES) or args.steps < 2:
        parser.error(f"--sizes from {list(SIZES)}; --steps >= 2")
    if args.child:  # one size, in this fresh process
        (name,) = sizes
        print(json.dumps(measure(name, args.steps) if args.child == "measure" else predict(name)))
        return 0
    rows = {name: check(name, args.steps) for name in sizes}
    ratios = [
        r[label]["predicted_over_measured"]
        for r in rows.values()
        for label in ("glibc_default", "mmap_threshold_64k")
    ]
    result = {
        "sizes": rows,
        "within_20_percent": all(abs(x - 1) <= 0.2 for x in ratios),
        "steps": args.steps,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
