"""GPU check: FSDP2 gradients on nccl against one process, then the `base` model in bf16 through
raytrain_vla on Ray (1 GPU worker, Ray Data decoding on the CPU cores) against a plain
single-process torch loop over in-memory tensors, at the largest micro-batch that fits.

Prints JSON and writes it to `$OUT/gpu_check.json` (or `--out`). `--dry-run` does the same on
CPU with gloo and the tiny model in a few steps, so the script is exercised by the test suite.

    bash benchmarks/gpu_check.sh             # one H200: under 8 minutes
    bash benchmarks/gpu_check.sh --dry-run   # CPU
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from raytrain_vla.config import load_config
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.data.dataset import DatasetView
from raytrain_vla.data.demo import write_demo_dataset
from raytrain_vla.models.flow_vla.options import FlowVLAOptions
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.flops import peak_tflops, training_flops_per_sample
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.inputs import ReadTransform
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import build_optimizer, build_scheduler, resolve_groups
from raytrain_vla.train.rank_exit import exit_rank
from raytrain_vla.train.step import StepRunner

FAMILY = get_family("flow_vla")

# -- 1. FSDP2 gradients against one process --------------------------------------------------


def _config(view: DatasetView, size: str):
    return FAMILY.resolve_config(FlowVLAOptions(size=size), view.spec)


def _build(config_dict: dict) -> torch.nn.Module:
    return FAMILY.build(FAMILY.config_from_dict(config_dict))


def _batch(view: DatasetView, ids: np.ndarray, device) -> dict:
    """Real decoded samples, prepared by the model's processor as the run's read tasks do."""
    processor = FAMILY.processor(_config(view, "tiny"), view.normalizer)
    ids = np.sort(ids)
    cols = ReadTransform(processor)(view.source.read(ids), np.zeros_like(ids))
    return processor.collate(cols, device)


def _grad_rank(rank: int, world: int, port: int, spec: dict, out: str) -> None:
    """One rank: full-size gradients for each of `spec["precisions"]`, sharded (or not, for the
    reference), from one process group: each spawn costs every rank a torch import."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = spec["device"] == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        batch = torch.load(spec["batch"], weights_only=True)
        per_rank = len(batch["sample_ids"]) // world
        mine = {
            k: ({c: x[rank * per_rank : (rank + 1) * per_rank].to(device) for c, x in v.items()}
                if isinstance(v, dict) else v[rank * per_rank : (rank + 1) * per_rank].to(device))
            for k, v in batch.items()
        }  # fmt: skip
        grads = {
            precision: _one_rank_grads(spec, precision, world, device, mine)
            for precision in spec["precisions"]
        }
        if rank == 0:
            torch.save(grads, out)
    except BaseException:
        dist.destroy_process_group()  # no barrier: the peers may never reach it
        raise
    del grads
    exit_rank()


def _one_rank_grads(spec: dict, precision: str, world: int, device, mine: dict) -> dict:
    """This rank's full-size gradients of one step on its slice `mine`, from a fresh model."""
    torch.manual_seed(0)
    model = _build(spec["model_config"]).to(device)
    groups = resolve_groups(model, OptimizerConfig())
    if spec["fsdp"]:
        apply_fsdp(model, init_device_mesh(device.type, (world,)), TrainConfig(precision=precision))
    optimizer = build_optimizer(model, groups, OptimizerConfig())
    scheduler = build_scheduler(optimizer, 10, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step: int, ids: list[int]):
        return flow_noise_and_time(0, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)
    runner.accumulate(0, [mine])
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = g.detach().float().cpu()
    return grads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_grads(world: int, spec: dict, tmp: Path, tag: str) -> dict:
    out = str(tmp / f"grads_{tag}.pt")
    mp.start_processes(
        _grad_rank, args=(world, _free_port(), spec, out), nprocs=world, start_method="spawn"
    )
    return torch.load(out, weights_only=True)


def grad_check(view: DatasetView, device: str, tmp: Path, size: str) -> dict:
    """FSDP2 fp32 and bf16 gradients on W ranks against the unsharded model in one process."""
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    # Two nccl ranks cannot share one GPU; then one rank still runs every FSDP2 collective.
    world = 2 if device == "cpu" else min(2, gpus)
    ids = view.plan.first_ids(8)
    batch_path = tmp / "grad_batch.pt"
    torch.save(_batch(view, ids, "cpu"), batch_path)
    config = _config(view, size).to_dict()
    spec = {"device": device, "model_config": config, "batch": str(batch_path)}
    reference = _spawn_grads(1, {**spec, "fsdp": False, "precisions": ["fp32"]}, tmp, "ref")["fp32"]
    result = {"backend": "nccl" if device == "cuda" else "gloo", "world_size": world}
    precisions = ["fp32", "bf16"]
    sharded_by_precision = _spawn_grads(
        world, {**spec, "fsdp": True, "precisions": precisions}, tmp, "sharded"
    )
    for precision in precisions:
        sharded = sharded_by_precision[precision]
        num = sum(float((sharded[k] - reference[k]).square().sum()) for k in reference)
        den = sum(float(reference[k].square().sum()) for k in reference)
        worst = max(
            float((sharded[k] - reference[k]).abs().max() / (reference[k].abs().max() + 1e-12))
            for k in reference
        )
        result[f"{precision}_rel_l2_error"] = (num / den) ** 0.5
        result[f"{precision}_worst_tensor_rel_error"] = worst
    # fp32 differs only in reduction order; bf16 compute with fp32 reduction stays within ~1%.
    result["ok"] = result["fp32_rel_l2_error"] < 1e-5 and result["bf16_rel_l2_error"] < 3e-2
    return result


# -- 2. Plain single-process loop over in-memory tensors --------------------------------------


def _plain_step(model, optimizer, batch: dict, noise, t, bf16: bool) -> None:
    with torch.autocast(batch["state"].device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model.compute_loss(batch, noise, t).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(view, size, micro: int, steps: int, device, bf16: bool) -> dict:
    torch.manual_seed(0)
    model = _build(_config(view, size).to_dict()).to(device)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    batch = _batch(view, view.plan.first_ids(micro), device)
    ids = batch["sample_ids"].tolist()
    noise, t = flow_noise_and_time(0, 0, ids, model.noise_shape)
    noise, t = noise.to(device), t.to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        _plain_step(model, optimizer, batch, noise, t, bf16)
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        _plain_step(model, optimizer, batch, noise, t, bf16)
    _sync(device)
    seconds = time.perf_counter() - start
    out = {"samples_per_s": steps * micro / seconds, "step_time_s": seconds / steps}
    if device.type == "cuda":
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    del model, optimizer
    return out


def largest_micro_batch(view, size, device, start: int, limit: int) -> int:
    """Double the micro-batch until a step runs out of memory or passes 85% of the card."""
    if device.type != "cuda":
        return start
    total = torch.cuda.get_device_properties(device).total_memory
    best, micro = start, start
    while micro <= limit:
        try:
            result = plain_loop(view, size, micro, 1, device, bf16=True)
        except torch.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
        if result["peak_mem_gb"] * 2**30 > 0.85 * total:
            break
        best, micro = micro, micro * 2
    return best


# -- 3. The same model and batch through raytrain_vla on Ray ---------------------------------


def ray_run(data: Path, storage: Path, size: str, micro: int, steps: int, gpu: bool) -> dict:
    from raytrain_vla import run

    cpus = os.cpu_count() or 2
    per_worker_cpus = 2 if gpu else 1
    args = [
        f"--data.root={data}",
        "--data.val_max_samples=64",
        f"--model.flow_vla.size={size}",
        f"--train.steps={steps}",
        f"--train.global_batch_size={micro}",
        f"--train.micro_batch_size={micro}",
        f"--train.precision={'bf16' if gpu else 'fp32'}",
        "--train.reshard_after_forward=false",
        f"--train.log_interval={max(1, steps // 4)}",
        f"--train.val_interval={steps}",
        f"--train.save_interval={steps}",
        "--scheduler.warmup_steps=0",
        f"--ray.use_gpu={str(gpu).lower()}",
        "--ray.num_workers=1",
        f'--ray.resources_per_worker={{"CPU": {per_worker_cpus}}}',
        # A private cluster of this size, unless the caller names one to join (RAY_ADDRESS).
        *(
            []
            if os.environ.get("RAY_ADDRESS")
            else [f"--ray.local_num_cpus={max(cpus, per_worker_cpus + 2)}"]
        ),
        f"--ray.storage_path={storage}",
        "--ray.run_name=gpu_check",
        "--logging.wandb_mode=disabled",
        "--eval.episodes=0",
        "--logging.console=false",
    ]
    if run.main(args) != 0:
        raise RuntimeError("the Ray run failed")
    rows = [
        json.loads(x) for x in (storage / "gpu_check" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in rows if r["kind"] == "train" and "samples_per_s" in r]
    steady = train[1:] or train  # the first window holds compilation and pipeline start
    keys = ("samples_per_s", "step_time_s", "data_wait_share", "tflops_per_s", "mfu", "peak_mem_gb")
    return {k: float(np.mean([r[k] for r in steady])) for k in keys if k in steady[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, a few steps")
    parser.add_argument("--out", default=os.environ.get("OUT", ""))
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    start = time.monotonic()
    gpu = torch.cuda.is_available() and not args.dry_run
    if not gpu and not args.dry_run:
        raise SystemExit("error: no CUDA device; use --dry-run on CPU")
    device = torch.device("cuda:0" if gpu else "cpu")
    size = "base" if gpu else "tiny"
    steps = args.steps or (40 if gpu else 6)
    report: dict = {
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "model_size": size,
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = write_demo_dataset(tmp / "demo", num_episodes=120 if gpu else 20, image_size=96)
        cfg = load_config(None, [f"--data.root={data}", "--data.val_max_samples=64"])
        view = DatasetView.open(cfg.data, 0, 8)
        report["grad_check"] = grad_check(view, device.type, tmp, "small" if gpu else "tiny")

        micro = largest_micro_batch(view, size, device, start=16, limit=1024) if gpu else 8
        report["micro_batch"] = micro
        torch.manual_seed(0)
        counter_model = _build(_config(view, size).to_dict()).to(device)
        batch = _batch(view, view.plan.first_ids(min(micro, 16)), device)
        flops = training_flops_per_sample(counter_model, batch)
        del counter_model
        peak = peak_tflops(device, "bf16")
        report["flops_per_sample"] = flops
        report["peak_tflops"] = peak or None

        plain = plain_loop(view, size, micro, steps, device, bf16=gpu)
        plain["tflops_per_s"] = plain["samples_per_s"] * flops / 1e12
        plain["mfu"] = plain["tflops_per_s"] / peak if peak else None
        report["plain"] = plain
        if gpu:
            torch.cuda.empty_cache()
        report["ray"] = ray_run(data, tmp / "runs", size, micro, steps, gpu)
        report["ray"].setdefault("mfu", None)
        report["ray_over_plain"] = report["ray"]["samples_per_s"] / plain["samples_per_s"]
    report["wall_s"] = round(time.monotonic() - start, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(text)


if __name__ == "__main__":
    main()
