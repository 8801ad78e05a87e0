"""The per-worker training loop that Ray Train's TorchTrainer runs on every rank.

Build order follows torchtitan: model (seeded, identical on every rank) -> shard -> optimizer ->
checkpoint load -> data from the cursor on. Everything Ray-specific stays in this file.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import register_fsdp_forward_method

from raytrain_vla import policy as policy_lib
from raytrain_vla.closed_loop import evaluate, is_demo_dataset, run_episodes
from raytrain_vla.config import Config, check_batch_layout, from_tree, recipe_hash, to_dict, to_yaml
from raytrain_vla.data.augment import ImageOps
from raytrain_vla.data.pipeline import InMemorySource, iter_rank_batches
from raytrain_vla.data.source import DatasetView
from raytrain_vla.export import policy_meta, write_policy
from raytrain_vla.models.flow_vla import flow_noise_and_time
from raytrain_vla.models.pretrained import build_init_source
from raytrain_vla.train import faults
from raytrain_vla.train.checkpoint import (
    TrainState,
    check_frozen,
    frozen_checksum,
    load_checkpoint,
    save_checkpoint,
)
from raytrain_vla.train.flops import example_batch, peak_tflops, training_flops_per_sample
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.materialize import materialize_from_rank0, meta_model
from raytrain_vla.train.metrics import MetricsLogger
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.resume import prune_untracked_checkpoints
from raytrain_vla.train.step import StepRunner
from raytrain_vla.train.validate import pad_to_ranks, validate


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.ray.storage_path).expanduser().resolve() / cfg.ray.run_name


def model_kwargs(cfg: Config, view: DatasetView) -> dict:
    return {
        "size": cfg.model.size,
        "camera_keys": view.camera_keys,
        "image_size": view.image_size,
        "state_dim": view.state_dim,
        "action_dim": view.action_dim,
        "chunk_size": cfg.data.chunk_size,
        "max_text_len": cfg.model.max_text_len,
        "num_inference_steps": cfg.model.num_inference_steps,
    }


def _threads_per_worker(cfg: Config) -> int:
    return max(1, int(cfg.ray.resources_per_worker.get("CPU", 1)))


def train_loop_per_worker(config_dict: dict) -> None:
    cfg = from_tree(config_dict, "train loop config")
    _quiet_report_log()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(_threads_per_worker(cfg))
    device = ray.train.torch.get_device()
    accum = check_batch_layout(cfg.train.global_batch_size, cfg.train.micro_batch_size, world)

    view = DatasetView.open(
        cfg.data, cfg.train.seed, cfg.train.global_batch_size, cfg.model.max_text_len
    )
    torch.manual_seed(cfg.train.seed)  # the same global RNG stream on every rank
    kwargs = model_kwargs(cfg, view)
    # Rank 0 alone builds the full init source (seeded init, then `model.init_from`); every rank
    # shards an empty meta model and receives its shards from rank 0. A checkpoint loaded below
    # then overwrites what it holds; frozen parameters keep the init source's values.
    source = None
    if rank == 0:
        source = build_init_source(
            cfg.model.type, kwargs, cfg.train.seed, cfg.model.init_from, cfg.model.init_allow
        )
    model = meta_model(cfg.model.type, kwargs)
    frozen = freeze_for_config(model, cfg.optimizer)
    flops_per_sample = 0.0  # logged by rank 0 only
    storage = torch.device("cpu") if cfg.train.cpu_offload else device
    if source is not None:
        freeze_for_config(source, cfg.optimizer)
        # Count where the model will run: a forward and backward of `base` is slow on CPU.
        source = source.to(storage)
        flops_per_sample = _count_flops(source, view, kwargs, storage)
    peak = peak_tflops(device, cfg.train.precision, cfg.train.peak_tflops)
    groups = resolve_groups(model.named_parameters(), cfg.optimizer)
    mesh = init_device_mesh(device.type, (world,))
    apply_fsdp(model, mesh, cfg.train)
    materialize_from_rank0(model, source.state_dict() if source is not None else None, storage)
    del source
    register_fsdp_forward_method(model, "sample_actions")
    frozen_sum = frozen_checksum(model, frozen) if frozen else []
    optimizer = build_optimizer(model, groups, cfg.optimizer)
    scheduler = build_scheduler(optimizer, cfg.train.steps, cfg.scheduler)
    chunk, action_dim = cfg.data.chunk_size, view.action_dim

    def noise_fn(step: int, ids: list[int]):
        return flow_noise_and_time(cfg.train.seed, step, ids, chunk, action_dim)

    runner = StepRunner(
        model, optimizer, scheduler, groups, noise_fn, cfg.train.grad_clip,
        nan_loss_step=cfg.debug.nan_loss_step if rank == cfg.debug.nan_loss_rank else -1,
    )  # fmt: skip

    config_hash = recipe_hash(cfg)
    start_step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            state = load_checkpoint(
                Path(ckpt_dir), model, optimizer, scheduler, rank, world, frozen
            )
        if state.config_hash != config_hash or state.dataset_fingerprint != view.fingerprint:
            raise ValueError(
                f"checkpoint of run '{state.run_name}' was made with a different recipe or dataset "
                f"(config hash {state.config_hash} vs {config_hash}, dataset {state.dataset_fingerprint} "
                f"vs {view.fingerprint}); use a new ray.run_name"
            )
        init_source = f"model.init_from={cfg.model.init_from or '(none: seeded init)'}"
        check_frozen(state, frozen_sum, init_source)
        start_step = state.step

    run_dir = run_dir_of(cfg)
    eval_episodes = cfg.eval.episodes if is_demo_dataset(cfg.data.root) else 0
    logger = None
    if rank == 0:
        if cfg.eval.episodes and not eval_episodes:
            print(
                f"[raytrain_vla] eval.episodes ignored: {cfg.data.root} is not the demo task's data"
            )
        for name in prune_untracked_checkpoints(run_dir):
            print(f"[raytrain_vla] removed unregistered checkpoint {run_dir / name}")
        logger = MetricsLogger(
            run_dir,
            cfg.logging,
            to_dict(cfg),
            cfg.train.steps,
            f"{cfg.ray.run_name}-{config_hash}",
            start_step,
        )
    val_batches = _load_val_batches(cfg, view, rank, world, device)
    work = view.plan.rank_work(start_step, cfg.train.steps, rank, world)
    batches = iter_rank_batches(
        view.source,
        work,
        cfg.train.micro_batch_size,
        cfg.data.samples_per_read_task,
        cfg.data.read_tasks_per_segment,
        epochs=view.plan.rank_work_epochs(start_step, cfg.train.steps, world),
        post=ImageOps(cfg.data.image_size, cfg.data.augment, cfg.train.seed),
    )
    sample_log = run_dir / "samples.jsonl" if cfg.debug.log_sample_ids else None

    window_start, window_wait, window_steps = time.perf_counter(), 0.0, 0
    for step in range(start_step, cfg.train.steps):
        t0 = time.perf_counter()
        micro = [view.transform(next(batches), device) for _ in range(accum)]
        window_wait += time.perf_counter() - t0
        metrics = runner.run(step, micro)
        done = step + 1
        window_steps += 1
        if sample_log is not None:
            ids = torch.cat([m["sample_ids"] for m in micro]).tolist()
            with sample_log.open("a") as f:
                f.write(
                    json.dumps({"step": step, "rank": rank, "world_size": world, "ids": ids}) + "\n"
                )
        if done % cfg.train.log_interval == 0 or done == cfg.train.steps:
            elapsed = time.perf_counter() - window_start
            metrics["samples_per_s"] = window_steps * cfg.train.global_batch_size / elapsed
            metrics["step_time_s"] = elapsed / window_steps
            metrics["data_wait_share"] = window_wait / elapsed
            metrics["tflops_per_s"] = metrics["samples_per_s"] * flops_per_sample / 1e12
            if peak:
                metrics["mfu"] = metrics["tflops_per_s"] / (peak * world)
            if device.type == "cuda":
                metrics["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
            if logger:
                logger.log(done, metrics)
            window_wait, window_steps = 0.0, 0
        val_metrics = {}
        if done % cfg.train.val_interval == 0 or done == cfg.train.steps:
            val_metrics = validate(
                model, val_batches, view.normalizer, view.mean_action, cfg.train.seed
            )
            if eval_episodes and cfg.eval.at_validation:  # collective: weights gathered on rank 0
                val_metrics.update(_closed_loop_now(model, cfg, view, kwargs, eval_episodes, rank))
            if logger:
                logger.log(done, val_metrics, kind="val")
        report = {"step": done, **{k: v for k, v in metrics.items() if "/" not in k}}
        report.update(val_metrics)  # only where it was measured: Tune schedules on it
        if done % cfg.train.save_interval == 0 or done == cfg.train.steps:
            cursor = view.plan.cursor_at(done)
            state = TrainState(
                done, cursor.epoch, cursor.sample_in_epoch, done * cfg.train.global_batch_size, world,
                cfg.ray.run_name, config_hash, view.fingerprint, len(frozen), frozen_sum,
            )  # fmt: skip
            with tempfile.TemporaryDirectory() as tmp:
                save_checkpoint(
                    Path(tmp),
                    model,
                    optimizer,
                    scheduler,
                    state,
                    rank,
                    to_yaml(cfg),
                    view.normalizer.to_dict(),
                    policy_meta(cfg.model.type, kwargs, view.mean_action, view.tasks),
                    frozen,
                )
                faults.in_checkpoint_write(cfg.debug, done, rank, run_dir)
                ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        elif val_metrics:
            ray.train.report(report)
        faults.after_step(cfg.debug, done, rank, run_dir)
        if cfg.debug.step_delay_s > 0:
            time.sleep(cfg.debug.step_delay_s)
        if window_steps == 0:
            window_start = time.perf_counter()  # validation and checkpoints stay out of step timing
    _export(cfg, model, view, kwargs, run_dir, rank)
    if logger:
        if eval_episodes:
            exported = policy_lib.load(
                run_dir / "export", seed=cfg.eval.seed, n_action_steps=cfg.eval.n_action_steps
            )
            image_size = int(kwargs["image_size"][0])
            results = evaluate(
                exported, eval_episodes, cfg.eval.seed, image_size, cfg.eval.rollouts_logged
            )
            logger.log_eval(cfg.train.steps, results)
        logger.close()


def _gather_full_state(model) -> dict:
    """Collective: the full weights on rank 0, in CPU memory; other ranks get an empty dict."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def _closed_loop_now(
    model, cfg: Config, view: DatasetView, kwargs: dict, episodes: int, rank: int
) -> dict[str, float]:
    """The policy's closed-loop success right now; rank 0 runs it on the gathered weights."""
    state = _gather_full_state(model)
    if rank != 0:
        return {}
    meta = policy_meta(cfg.model.type, kwargs, view.mean_action, view.tasks)
    live = policy_lib.from_state(
        state, meta, view.normalizer, cfg.eval.seed, cfg.eval.n_action_steps
    )
    result = run_episodes(
        "policy", live.select_action, live.reset, episodes, cfg.eval.seed,
        int(kwargs["image_size"][0]),
    )  # fmt: skip
    return {
        "eval_success_rate": result.success_rate,
        "eval_final_distance": result.mean_final_distance,
    }


def _quiet_report_log() -> None:
    """Ray logs each report's whole metrics dict at INFO, under a logger named by its file path;
    the console line already says it."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its log lines stay
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def _count_flops(model, view: DatasetView, kwargs: dict, device) -> float:
    """Training FLOPs per sample on this dataset's instructions (before sharding)."""
    t = view.transform
    batch = example_batch(
        t.task_tokens, t.task_mask, list(kwargs["camera_keys"]), list(kwargs["image_size"]),
        kwargs["state_dim"], kwargs["action_dim"], kwargs["chunk_size"], device,
    )  # fmt: skip
    return training_flops_per_sample(model, batch)


def preload(view: DatasetView) -> InMemorySource:
    """Decode every sample the run can touch once, so the stream measures no decoding."""
    ids = np.union1d(view.plan.sample_ids, view.val_ids)
    return InMemorySource(view.source.read(ids))


def _load_val_batches(cfg: Config, view: DatasetView, rank: int, world: int, device) -> list:
    """Decode this rank's share of the held-out samples once; validation reuses them."""
    micro = cfg.train.micro_batch_size
    ids, weight = pad_to_ranks(view.val_ids, world, micro)
    per_rank = len(ids) // world
    mine = ids[rank * per_rank : (rank + 1) * per_rank]
    w = torch.from_numpy(weight[rank * per_rank : (rank + 1) * per_rank])
    out = []
    for i, cols in enumerate(
        iter_rank_batches(
            view.source,
            mine,
            micro,
            cfg.data.samples_per_read_task,
            post=ImageOps(cfg.data.image_size),
        )
    ):
        out.append((view.transform(cols, device), w[i * micro : (i + 1) * micro]))
    return out


def _export(cfg: Config, model, view: DatasetView, kwargs: dict, run_dir: Path, rank: int) -> None:
    """Gather the full weights on rank 0 (CPU) and write the policy directory."""
    state = _gather_full_state(model)
    if rank == 0:
        write_policy(
            run_dir / "export",
            state,
            cfg.model.type,
            kwargs,
            view.normalizer,
            view.mean_action,
            view.tasks,
        )
    if dist.is_initialized():
        dist.barrier()
