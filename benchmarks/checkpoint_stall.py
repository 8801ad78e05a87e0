"""How much training time a checkpoint costs: synchronous against background saves.

`--workers` gloo workers (2, as a run on this machine; 1 leaves a core idle, as a GPU node's host
CPUs are) train flow_vla widened to `--d-model` (about 136M
parameters at the default, so a synchronous save of parameters plus AdamW state takes seconds)
with the trainer's own pieces: `apply_fsdp`, `StepRunner`, `tensor_state` and `CheckpointSaver`.
Each worker:

1. saves synchronously (DCP shards + manifest): the whole save is stall;
2. times a window of `--steps` steps (more if the save is still in flight) with a background save
   started at its beginning, polling every step as the trainer does, beside a window of the same
   number of steps without a save, in alternating order so that drift cancels. The stall is
   what the save's window took beyond the baseline's step time.

3. after each synchronous save, times its hand-over to local run storage: Ray Train's copy
   (`handoff_copy_s`, the upload before `checkpoint_scratch.move_into`) and the rename used now
   (`handoff_move_s`).

`stall_ratio` = background stall / synchronous save time, the larger of the two workers' (the
slower rank holds the others at the next collective). Repeats `--repeats` times, median. JSON.

`--device cuda`: one GPU per worker, nccl, the model and AdamW state on the GPU, staging into
pinned shared host memory (as the trainer does there); the step loop then leaves the host CPUs
to the writer. Widen the model there (`--d-model 1024 --layers 8`: 240M parameters, 2.9 GB with
AdamW state, which `/dev/shm` must hold) so that a synchronous save takes seconds; that is what
`gpu_check.sh` runs.

    python benchmarks/checkpoint_stall.py
    python benchmarks/checkpoint_stall.py --device cuda --workers 1 --d-model 1024 --layers 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ray.train import Checkpoint
from ray.train.v2._internal.execution.storage import StorageContext

from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.checkpoint import tensor_state
from raytrain_vla.train.checkpoint_saver import CheckpointSaver
from raytrain_vla.train.checkpoint_scratch import move_into
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.launch import worker_env_vars
from raytrain_vla.train.mesh import build_mesh
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import build_optimizer, build_scheduler, resolve_groups
from raytrain_vla.train.step import StepRunner

MICRO = 4
CPU = torch.device("cpu")


def config(d_model: int, layers: int) -> FlowVLAConfig:
    return FlowVLAConfig.from_size(
        "small", d_model=d_model, expert_d_model=d_model, backbone_layers=layers,
        expert_layers=layers, num_heads=8, expert_heads=8,
    )  # fmt: skip


def batch(step: int, rank: int, device: torch.device = CPU) -> dict:
    g = torch.Generator().manual_seed(step * 8 + rank)
    tokens, mask = tokenize(["reach the red disc"] * MICRO, 48)
    micro = {
        "sample_ids": torch.arange(MICRO) + (step * 8 + rank) * MICRO,
        "images": {"observation.image": torch.rand(MICRO, 3, 32, 32, generator=g)},
        "state": torch.randn(MICRO, 2, generator=g),
        "text_tokens": tokens,
        "text_mask": mask,
        "actions": torch.randn(MICRO, 8, 2, generator=g),
        "action_is_pad": torch.zeros(MICRO, 8, dtype=torch.bool),
    }
    if device.type == "cpu":
        return micro
    return {
        key: {k: v.to(device) for k, v in value.items()} if isinstance(value, dict)
        else value.to(device)
        for key, value in micro.items()
    }  # fmt: skip


def handoff(directory: Path, storage: StorageContext, repeat: int) -> tuple[float, float]:
    """Seconds to hand a rank's saved checkpoint over to local run storage: Ray Train's own
    upload (a copy) and the trainer's rename (`move_into`); a synchronous save stalls for both
    the save and this. Both leave a complete checkpoint in storage; the copy keeps the source
    for the move."""
    dist.barrier()
    start = time.perf_counter()
    storage.persist_current_checkpoint(Checkpoint(str(directory)), f"copied{repeat}")
    copy_s = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    assert move_into(directory, Path(storage.build_checkpoint_path_from_name(f"moved{repeat}")))
    return copy_s, time.perf_counter() - start


def training(
    d_model: int, layers: int, world: int, device: torch.device = CPU
) -> tuple[torch.nn.Module, StepRunner]:
    """The widened flow_vla under FSDP2 on the initialised process group, and its step runner
    (1 thread, as each rank here)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = get_family("flow_vla").build(config(d_model, layers)).to(device)
    opt_cfg = OptimizerConfig(lr=1e-4, groups=[])
    groups = resolve_groups(model, opt_cfg)
    apply_fsdp(model, build_mesh(device.type, world, 0), TrainConfig())
    optimizer = build_optimizer(model, groups, opt_cfg)
    scheduler = build_scheduler(optimizer, 10**6, SchedulerConfig(type="constant", warmup_steps=0))

    def noise_fn(step, ids):
        return flow_noise_and_time(0, step, ids, model.noise_shape)

    return model, StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)


def _rank(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    model, runner = training(args.d_model, args.layers, world, device)
    optimizer = runner.optimizer
    params = sum(p.numel() for p in model.parameters())
    step = 0

    def train_step(saver: CheckpointSaver | None = None) -> float:
        """One step (and the saver's poll, as the trainer does); its seconds."""
        nonlocal step
        start = time.perf_counter()
        runner.run(step, [batch(step, rank, device)])
        if saver is not None:
            saver.poll()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step += 1
        return time.perf_counter() - start

    for _ in range(2):  # warm-up: AdamW state exists from here on
        train_step()
    root = Path(tempfile.mkdtemp(prefix="ckpt_stall-", dir=args.dir))
    storage = StorageContext(str(root / "storage"), "run")
    sync = CheckpointSaver(background=False, device=device)
    background = CheckpointSaver(background=True, device=device, optimizer=optimizer)
    # As in a run, one saver serves every save: the first starts DCP's checkpoint process and
    # allocates the staging buffers, once per run, so it is left out of the timing.
    start = time.perf_counter()
    background.save(root / "warmup", tensor_state(model, optimizer), rank, lambda: None)
    background.finish()
    first_save_s = time.perf_counter() - start
    rows = []
    for repeat in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        sync.save(root / f"sync{repeat}", tensor_state(model, optimizer), rank, lambda: None)
        sync_s = time.perf_counter() - start
        copy_s, move_s = handoff(root / f"sync{repeat}", storage, repeat)
        # A window of steps with a background save started at its beginning, and beside it (in
        # alternating order, so that drift in the machine's speed cancels) a window of the same
        # steps without one. The save's window runs until the save is complete.
        windows = {}
        for kind in ("base", "save") if repeat % 2 == 0 else ("save", "base"):
            done: list = []
            dist.barrier()
            start = time.perf_counter()
            if kind == "save":
                background.save(
                    root / f"async{repeat}",
                    tensor_state(model, optimizer),
                    rank,
                    lambda d=done: d.append(1),
                )
            call_s = time.perf_counter() - start
            step_times = []
            while len(step_times) < args.steps or (kind == "save" and not done):
                step_times.append(train_step(background))
            windows[kind] = (time.perf_counter() - start, step_times, call_s)
        base_s, base_steps, _ = windows["base"]
        save_s, save_steps, call_s = windows["save"]
        step_s = base_s / len(base_steps)
        rows.append(
            {
                "step_s": step_s, "sync_save_s": sync_s, "async_call_s": call_s,
                "handoff_copy_s": copy_s, "handoff_move_s": move_s,
                "async_steps_in_flight": len(save_steps), "async_window_s": save_s,
                "async_stall_s": save_s - step_s * len(save_steps),
                # Where the stall falls: each step of both windows.
                "async_window_step_s": save_steps, "base_window_step_s": base_steps,
            }
        )  # fmt: skip
    background.close()
    size = sum(f.stat().st_size for f in (root / "async0").rglob("*") if f.is_file())
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        result = {"params": params, "bytes": size, "ranks": gathered, "first_save_s": first_save_s}
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    # Not `rank_exit.exit_rank`: DCP's checkpoint process is told to stop only at interpreter
    # finalization, which `os._exit` skips (the process then dies on a closed pipe).
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per window (at least)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (a temp dir)")
    args = parser.parse_args()
    if min(args.steps, args.repeats, args.workers) < 1:
        parser.error("--steps, --repeats and --workers must be at least 1")
    if args.device == "cuda" and torch.cuda.device_count() < args.workers:
        parser.error(f"--device cuda needs a GPU per worker: {args.workers} workers, "
                     f"{torch.cuda.device_count()} GPU(s)")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        args.dir = tmp
        os.environ.update(worker_env_vars(os.environ))  # the ranks run as the trainer's workers
        mp.start_processes(
            _rank, args=(args.workers, store, args, out), nprocs=args.workers,
            start_method="spawn",
        )  # fmt: skip
        result = json.loads(Path(out).read_text())
    per_repeat = []
    for i in range(args.repeats):
        rows = [ranks[i] for ranks in result["ranks"]]
        sync = max(r["sync_save_s"] for r in rows)
        stall = max(r["async_stall_s"] for r in rows)
        copy, move = (max(r[k] for r in rows) for k in ("handoff_copy_s", "handoff_move_s"))
        per_repeat.append(
            {"sync_save_s": sync, "async_stall_s": stall, "handoff_copy_s": copy,
             "handoff_move_s": move, "rows": rows}
        )  # fmt: skip
    sync = statistics.median(r["sync_save_s"] for r in per_repeat)
    stall = statistics.median(r["async_stall_s"] for r in per_repeat)
    report = {
        "device": args.device,
        "workers": args.workers,
        "params": result["params"],
        "checkpoint_bytes": result["bytes"],
        "sync_save_s": round(sync, 3),
        "async_stall_s": round(stall, 3),
        "stall_ratio": round(max(stall, 0.0) / sync, 3),
        "first_background_save_s": round(result["first_save_s"], 3),
        # Into local run storage after a synchronous save: Ray's copy, and the rename used now.
        "handoff_copy_s": round(statistics.median(r["handoff_copy_s"] for r in per_repeat), 3),
        "handoff_move_s": round(statistics.median(r["handoff_move_s"] for r in per_repeat), 4),
        "repeats": per_repeat,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
