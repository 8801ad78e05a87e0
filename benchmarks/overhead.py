"""Framework overhead: raytrain_vla on Ray vs a plain 2-process torch.distributed FSDP2 loop.

Both sides run the same model, global batch, micro-batch, step count and step function (FSDP2 +
StepRunner, the family's processor making the inputs).

(a) Ray: `raytrain_vla.run` as a user runs it. Ray Train workers; Ray Data read tasks decode the
    demo dataset's mp4s and run the processor one segment ahead of the loop; metrics each log
    window. Its time therefore includes any data wait the pipeline fails to hide
    (`ray_data_wait_share`).
(b) plain: bare `torch.multiprocessing` + gloo over micro-batches decoded and prepared into
    memory before the clock starts.

The ratio a / b prices everything raytrain_vla adds. The sides alternate (plain, Ray, plain,
Ray, ...) for `--rounds` rounds, so load from other processes on a shared machine falls on both;
the JSON holds every round and the median ratio with its min and max. Timed steps exclude the
first `--warmup` steps on both sides.

    python benchmarks/overhead.py --size small --steps 30 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain_vla.config import load_config
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.data.demo import ensure_dataset
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.inputs import ReadTransform
from raytrain_vla.train.launch import worker_env_vars
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import build_optimizer, build_scheduler, resolve_groups
from raytrain_vla.train.rank_exit import exit_rank
from raytrain_vla.train.step import StepRunner


def _overrides(args: argparse.Namespace, run_dir: str, name: str) -> list[str]:
    return [
        f"--data.root={args.data}",
        f"--model.flow_vla.size={args.size}",
        f"--train.steps={args.steps}",
        f"--train.global_batch_size={args.global_batch}",
        f"--train.micro_batch_size={args.micro_batch}",
        f"--train.log_interval={args.warmup}",
        f"--train.val_interval={10 * args.steps}",
        f"--train.save_interval={10 * args.steps}",
        "--data.val_max_samples=8",
        f"--ray.storage_path={run_dir}",
        f"--ray.run_name={name}",
        "--logging.wandb_mode=disabled",
        "--logging.console=false",
        "--eval.episodes=0",
    ]


def _plain_worker(
    rank: int, world: int, port: int, overrides: list[str], warmup: int, out: str
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    view = DatasetView.open(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    family = get_family(cfg.model.type)
    config = family.resolve_config(cfg.model.options, view.spec)
    processor = family.processor(config, view.normalizer)
    torch.manual_seed(cfg.train.seed)
    model = family.build(config)
    groups = resolve_groups(model, cfg.optimizer)
    apply_fsdp(model, torch.distributed.device_mesh.init_device_mesh("cpu", (world,)), cfg.train)
    optimizer = build_optimizer(model, groups, cfg.optimizer)
    scheduler = build_scheduler(optimizer, cfg.train.steps, cfg.scheduler)

    def noise_fn(step, ids):
        return flow_noise_and_time(cfg.train.seed, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, cfg.train.grad_clip)
    micro = cfg.train.micro_batch_size
    accum = cfg.train.global_batch_size // (world * micro)
    prepare = ReadTransform(processor)
    # Decoded and prepared into memory before the clock starts.
    steps = []
    for step in range(cfg.train.steps):
        ids = view.plan.rank_slice(step, rank, world)
        cols = prepare(view.source.read(ids), np.zeros(len(ids), np.int64))
        steps.append(
            [
                processor.collate(
                    {k: v[i * micro : (i + 1) * micro] for k, v in cols.items()}, "cpu"
                )
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
    exit_rank()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain(args: argparse.Namespace, run_dir: str, name: str) -> float:
    out = os.path.join(run_dir, f"{name}.json")
    os.environ.update(worker_env_vars(os.environ))  # the environment the Ray workers get
    mp.spawn(
        _plain_worker,
        args=(2, _free_port(), _overrides(args, run_dir, name), args.warmup, out),
        nprocs=2,
        join=True,
    )
    return json.loads(Path(out).read_text())["steps_per_s"]


def on_ray(args: argparse.Namespace, run_dir: str, name: str) -> tuple[float, float]:
    """(steps/s, share of step time waiting for data) over the timed windows."""
    from raytrain_vla import run

    code = run.main(_overrides(args, run_dir, name))
    ray.shutdown()  # the plain round after this one runs with no Ray processes around
    if code != 0:
        raise RuntimeError(f"raytrain_vla.run exited {code}")
    records = [json.loads(line) for line in open(Path(run_dir) / name / "metrics.jsonl")]
    # Every log window after the first holds `warmup` steps; step_time_s is that window's mean.
    timed = [r for r in records if r["kind"] == "train" and r["step"] > args.warmup]
    steps_per_s = 1.0 / float(np.mean([r["step_time_s"] for r in timed]))
    return steps_per_s, float(np.mean([r["data_wait_share"] for r in timed]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="alternating plain/Ray rounds")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--data", default="~/.cache/raytrain_vla/bench_demo")
    args = parser.parse_args()
    if args.steps % args.warmup:
        parser.error("--steps must be a multiple of --warmup (the log interval)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    demo = ["--data.write_demo_if_missing=true", "--data.demo_episodes=200"]
    cfg = load_config(None, [f"--data.root={args.data}", *demo])
    args.data = str(ensure_dataset(cfg.data))
    rounds = []
    with tempfile.TemporaryDirectory() as run_dir:
        for i in range(args.rounds):
            plain_rate = plain(args, run_dir, f"plain_{i}")
            ray_rate, wait = on_ray(args, run_dir, f"ray_{i}")
            rounds.append(
                {
                    "plain_fsdp_steps_per_s": round(plain_rate, 4),
                    "ray_steps_per_s": round(ray_rate, 4),
                    "ray_data_wait_share": round(wait, 4),
                    "ratio_ray_over_plain": round(ray_rate / plain_rate, 4),
                }
            )
    ratios = [r["ratio_ray_over_plain"] for r in rounds]
    result = {
        "model_size": args.size,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "timed_steps": args.steps - args.warmup,
        "ray_side": "run.main: Ray Data decodes mp4s and runs the processor in read tasks",
        "plain_side": "2 gloo processes over micro-batches prepared in memory beforehand",
        "rounds": rounds,
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
