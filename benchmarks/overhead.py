"""Framework overhead: raytrain_vla on Ray vs a plain 2-process torch.distributed FSDP2 loop.

Both sides run the same model, global batch, micro-batch, step count and step function (FSDP2 +
StepRunner). (a) goes through `raytrain_vla.run` with `data.preload=true`, so already-decoded
samples flow through the same Ray Data path the loop always uses; (b) is a bare
`torch.multiprocessing` + gloo loop over in-memory tensors. Prints JSON with both rates and
their ratio (a / b). Timed steps exclude the first `--warmup` steps on both sides.

    python benchmarks/overhead.py --size small --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain_vla.config import load_config
from raytrain_vla.data.source import DatasetView, ensure_dataset
from raytrain_vla.models.flow_vla import flow_noise_and_time
from raytrain_vla.models.registry import build_model
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.optim import build_optimizer, build_scheduler, resolve_groups
from raytrain_vla.train.step import StepRunner
from raytrain_vla.train.worker import model_kwargs


def _overrides(args: argparse.Namespace, run_dir: str) -> list[str]:
    return [
        f"--data.root={args.data}",
        "--data.preload=true",
        f"--model.size={args.size}",
        f"--train.steps={args.steps}",
        f"--train.global_batch_size={args.global_batch}",
        f"--train.micro_batch_size={args.micro_batch}",
        f"--train.log_interval={args.warmup}",
        f"--train.val_interval={10 * args.steps}",
        f"--train.save_interval={10 * args.steps}",
        "--data.val_max_samples=8",
        f"--ray.storage_path={run_dir}",
        "--ray.run_name=overhead",
        "--logging.wandb_mode=disabled",
        "--eval.episodes=0",
    ]


def _plain_worker(
    rank: int, world: int, port: int, overrides: list[str], warmup: int, out: str
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    view = DatasetView.open(
        cfg.data, cfg.train.seed, cfg.train.global_batch_size, cfg.model.max_text_len
    )
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model.type, model_kwargs(cfg, view))
    groups = resolve_groups(model.named_parameters(), cfg.optimizer)
    apply_fsdp(model, torch.distributed.device_mesh.init_device_mesh("cpu", (world,)), cfg.train)
    optimizer = build_optimizer(model, groups, cfg.optimizer)
    scheduler = build_scheduler(optimizer, cfg.train.steps, cfg.scheduler)

    def noise_fn(step, ids):
        return flow_noise_and_time(cfg.train.seed, step, ids, cfg.data.chunk_size, view.action_dim)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, cfg.train.grad_clip)
    micro, accum = (
        cfg.train.micro_batch_size,
        cfg.train.global_batch_size // (world * cfg.train.micro_batch_size),
    )
    # In-memory tensors, decoded and transformed before the clock starts.
    steps = []
    for step in range(cfg.train.steps):
        ids = view.plan.rank_slice(step, rank, world)
        cols = view.source.read(ids)
        steps.append(
            [
                view.transform({k: v[i * micro : (i + 1) * micro] for k, v in cols.items()})
                for i in range(accum)
            ]
        )
    dist.barrier()
    for step in range(cfg.train.steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        runner.run(step, steps[step])
    dist.barrier()
    if rank == 0:
        Path(out).write_text(
            json.dumps({"steps_per_s": (cfg.train.steps - warmup) / (time.perf_counter() - start)})
        )
    dist.destroy_process_group()


def plain(args: argparse.Namespace, run_dir: str) -> float:
    out = os.path.join(run_dir, "plain.json")
    port = 29500 + os.getpid() % 1000
    mp.spawn(
        _plain_worker,
        args=(2, port, _overrides(args, run_dir), args.warmup, out),
        nprocs=2,
        join=True,
    )
    return json.loads(Path(out).read_text())["steps_per_s"]


def on_ray(args: argparse.Namespace, run_dir: str) -> float:
    from raytrain_vla import run

    code = run.main(_overrides(args, run_dir))
    if code != 0:
        raise RuntimeError(f"raytrain_vla.run exited {code}")
    records = [json.loads(line) for line in open(Path(run_dir) / "overhead" / "metrics.jsonl")]
    # Every log window after the first holds `warmup` steps; step_time_s is that window's mean.
    timed = [r["step_time_s"] for r in records if r["kind"] == "train" and r["step"] > args.warmup]
    return 1.0 / float(np.mean(timed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--data", default="~/.cache/raytrain_vla/bench_demo")
    args = parser.parse_args()
    if args.steps % args.warmup:
        parser.error("--steps must be a multiple of --warmup (the log interval)")
    cfg = load_config(None, [f"--data.root={args.data}", "--data.demo_episodes=200"])
    ensure_dataset(cfg.data)
    with tempfile.TemporaryDirectory() as run_dir:
        plain_rate = plain(args, run_dir)
        ray_rate = on_ray(args, run_dir)
    result = {
        "model_size": args.size,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "timed_steps": args.steps - args.warmup,
        "ray_steps_per_s": round(ray_rate, 4),
        "plain_fsdp_steps_per_s": round(plain_rate, 4),
        "ratio_ray_over_plain": round(ray_rate / plain_rate, 4),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
