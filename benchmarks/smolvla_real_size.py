"""SmolVLA at the published SmolVLM2-500M-Video-Instruct dimensions, random weights, no download.

The benchmark writes the VLM's config (the public values of HuggingFaceTB/SmolVLM2-500M-Video-
Instruct) into a temporary directory, resolves it through the smolvla family with LeRobot's
`smolvla_base` settings (16 kept text layers, expert width x0.75, cross-attention every other
layer, chunk 50, 512 x 512 images, `train_expert_only`), and reports:

* the parameter count (LeRobot reports about 450M) and how many train;
* one training step (loss, backward, clipped AdamW update) at global batch 2, timed in a plain
  single-process loop and with FSDP2 (the trainer's `apply_fsdp` + `StepRunner`) on 2 gloo
  workers at 1 sample each, side by side, as a ratio; peak RSS of each process. On CPU the two
  sides run `--rounds` times, interleaved (the order alternates so that drift in the machine's
  speed cancels), each in a fresh process; a round's ratio is its FSDP2 step over its plain
  step, and the reported ratio is the median over rounds, with every round's figures beside it.
  The FSDP side's frozen weights are placed by `--frozen-params` (default `auto`, which
  replicates them here); `fsdp_over_plain_step_time` is its ratio. Once more, after the rounds,
  frozen weights sharded and gathered every step (`train.frozen_params=shard`, the old
  behaviour). Each FSDP2 side also reports the bytes one step all-gathers and reduce-scatters
  (`train/comm.py`, as in metrics.jsonl);
* the floor under any data-parallel step on these CPUs: 2 independent processes of 1 thread,
  each training its own copy on 1 sample with no communication
  (`independent_processes_over_plain_step_time`), and FSDP2's cost above it
  (`fsdp_over_independent_step_time`).

The FSDP2 ranks and the floor's processes get the environment the trainer gives its workers
(`train/launch.worker_env_vars`: torch's allocator on transparent huge pages unless
THP_MEM_ALLOC_ENABLE says otherwise). The plain process gets the same environment, so that
`fsdp_over_plain_step_time` compares like with like; where the caller's environment differs (no
THP_MEM_ALLOC_ENABLE, as a user's plain script runs) a third side per round times the plain
process in it too (`fsdp_over_caller_env_plain_step_time`).

On a CUDA machine `--device cuda --precision bf16` times the same step on one GPU and adds
samples/s and MFU (FLOPs counted by torch's FlopCounterMode).

    python benchmarks/smolvla_real_size.py --steps 3 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain_vla.common.spec import DataSpec
from raytrain_vla.config import load_config
from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.models.registry import get_family
from raytrain_vla.models.smolvla.options import SmolVLAOptions
from raytrain_vla.train.comm import CommCounter
from raytrain_vla.train.flops import peak_tflops, training_flops_per_sample
from raytrain_vla.train.frozen import frozen_bytes, place_frozen, rank_memory_bytes
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.launch import HUGE_PAGES_ENV, worker_env_vars
from raytrain_vla.train.materialize import materialize_from_rank0, meta_model
from raytrain_vla.train.mesh import build_mesh
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.rank_exit import exit_rank
from raytrain_vla.train.step import StepRunner

# HuggingFaceTB/SmolVLM2-500M-Video-Instruct, config.json (public values).
SMOLVLM2_500M = {
    "model_type": "smolvlm",
    "image_token_id": 49190,
    "scale_factor": 4,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama",
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
        "head_dim": 64,
        "vocab_size": 49280,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "pad_token_id": 2,
    },
    "vision_config": {
        "model_type": "smolvlm_vision",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 512,
        "patch_size": 16,
        "num_channels": 3,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    },
}
CHUNK, TEXT_LEN, CAMERA = 50, 48, "observation.images.camera1"
SPEC = DataSpec({CAMERA: (3, 512, 512)}, state_dim=6, action_dim=6, chunk_size=CHUNK)


def resolve(vlm_dir: str):
    family = get_family("smolvla")
    return family, family.resolve_config(SmolVLAOptions(vlm_path=vlm_dir), SPEC)


def batch(n: int, device: torch.device, seed: int) -> dict:
    """A collated batch as the processor makes it (images already at 512 x 512 in [-1, 1])."""
    g = torch.Generator().manual_seed(seed)
    return {
        "images": {CAMERA: (torch.rand((n, 3, 512, 512), generator=g) * 2 - 1).to(device)},
        "image_masks": {CAMERA: torch.ones(n, dtype=torch.bool, device=device)},
        "lang_tokens": torch.randint(7, 49000, (n, TEXT_LEN), generator=g).to(device),
        "lang_masks": torch.ones((n, TEXT_LEN), dtype=torch.bool, device=device),
        "state": torch.randn((n, 32), generator=g).to(device),
        "actions": torch.randn((n, CHUNK, 32), generator=g).to(device),
        "action_is_pad": torch.zeros((n, CHUNK), dtype=torch.bool, device=device),
        "sample_ids": torch.arange(seed * n, seed * n + n, device=device),
    }


def peak_rss_mb() -> float:
    """This process's peak resident memory. /proc's VmHWM, not getrusage: ru_maxrss survives
    exec, so a spawned rank would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_steps(
    model, samples: int, steps: int, device: torch.device, rank: int = 0, comm=None
) -> list[float]:
    optim_cfg = OptimizerConfig(lr=1e-4, groups=[])
    groups = resolve_groups(model, optim_cfg)
    optimizer = build_optimizer(model, groups, optim_cfg)
    scheduler = build_scheduler(
        optimizer, steps + 1, SchedulerConfig(type="constant", warmup_steps=0)
    )

    def noise_fn(step: int, ids: list[int]):
        noise, time_ = flow_noise_and_time(0, step, ids, model.noise_shape)
        return noise.to(device), time_.to(device)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=10.0)
    times = []
    for step in range(steps + 1):  # the first step warms up
        micro = batch(samples, device, seed=step * 8 + rank)
        start = time.perf_counter()
        runner.run(step, [micro])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        if comm is not None:
            comm.last_step = comm.take()
    return times[1:]


def plain(vlm_dir: str, steps: int, device: str, precision: str, count_flops: bool = True) -> dict:
    family, config = resolve(vlm_dir)
    torch.manual_seed(0)
    model = family.build(config).to(device)
    freeze_for_config(model, OptimizerConfig())
    counts = {
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    dtype = torch.bfloat16 if precision == "bf16" else None
    dev = torch.device(device)
    with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
        times = run_steps(model, 2, steps, dev)
        flops = training_flops_per_sample(model, batch(1, dev, 99)) if count_flops else None
    step_s = statistics.median(times)
    out = {**counts, "plain_step_s": step_s, "plain_peak_rss_mb": peak_rss_mb()}
    out["samples_per_s"] = 2 / step_s
    out["torch_threads"] = torch.get_num_threads()
    if flops is not None:
        peak = peak_tflops(dev, precision)
        if peak:
            out["mfu"] = flops * out["samples_per_s"] / (peak * 1e12)
        out["train_flops_per_sample"] = flops
    return out


@contextlib.contextmanager
def environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """`values` in os.environ (None: unset) while processes are spawned (they inherit it),
    then restored."""

    def apply(settings: Mapping[str, str | None]) -> None:
        for key, value in settings.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    saved = {key: os.environ.get(key) for key in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def _plain_process(_index: int, vlm_dir: str, steps: int, count_flops: bool, out: str) -> None:
    Path(out).write_text(json.dumps(plain(vlm_dir, steps, "cpu", "fp32", count_flops)))


def plain_in_fresh_process(
    vlm_dir: str, steps: int, env: Mapping[str, str | None], count_flops: bool
) -> dict:
    """The plain loop in a fresh process with `env`: torch reads THP_MEM_ALLOC_ENABLE once, at
    its first allocation, so each environment needs its own process."""
    out = Path(vlm_dir) / "plain.json"
    with environment(env):
        mp.start_processes(
            _plain_process, args=(vlm_dir, steps, count_flops, str(out)), nprocs=1,
            start_method="spawn",
        )  # fmt: skip
    return json.loads(out.read_text())


def _rank(
    rank: int,
    world: int,
    port: int,
    vlm_dir: str,
    steps: int,
    out: str,
    frozen_mode: str,
    reshard: bool,
    dp_shard: int,
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    family, config = resolve(vlm_dir)
    source = None
    if rank == 0:
        torch.manual_seed(0)
        source = family.build(config)
        freeze_for_config(source, OptimizerConfig())
    model = meta_model(family, config)
    frozen = freeze_for_config(model, OptimizerConfig())
    # The trainer's rule (train.frozen_params): `auto` replicates frozen weights that fit.
    placement = place_frozen(
        frozen_mode,
        frozen_bytes(model, frozen, "fp32"),
        rank_memory_bytes(torch.device("cpu"), world),
    )
    comm = CommCounter()
    replicated = frozen if placement == "replicate" else []
    train = TrainConfig(reshard_after_forward=reshard)
    apply_fsdp(model, build_mesh("cpu", world, dp_shard), train, replicated, comm)
    materialize_from_rank0(model, source.state_dict() if source is not None else None, "cpu")
    del source
    times = run_steps(model, 2 // world, steps, torch.device("cpu"), rank, comm)
    rss = torch.tensor([peak_rss_mb()])
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, rss)
    if rank == 0:
        result = {"times": times, "rss": [float(r) for r in gathered], "placement": placement}
        Path(out).write_text(json.dumps({**result, "comm": comm.last_step}))
    del model
    exit_rank()


def _independent_rank(rank: int, vlm_dir: str, steps: int, samples: int, out: str) -> None:
    torch.set_num_threads(1)
    family, config = resolve(vlm_dir)
    torch.manual_seed(0)
    model = family.build(config)
    freeze_for_config(model, OptimizerConfig())
    times = run_steps(model, samples, steps, torch.device("cpu"), rank)
    Path(out).with_suffix(f".{rank}.json").write_text(json.dumps(times))


def independent(vlm_dir: str, steps: int, world: int = 2) -> dict:
    """The floor of any data-parallel step here: `world` processes of 1 thread, each training
    its own copy on its share of the batch with no communication at all."""
    out = Path(vlm_dir) / "independent"
    with environment(worker_env_vars(os.environ)):
        mp.start_processes(
            _independent_rank, args=(vlm_dir, steps, 2 // world, str(out)), nprocs=world,
            start_method="spawn",
        )  # fmt: skip
    medians = [
        statistics.median(json.loads(out.with_suffix(f".{r}.json").read_text()))
        for r in range(world)
    ]
    return {"step_s": max(medians), "per_process_step_s": medians}


def fsdp(
    vlm_dir: str, steps: int, frozen_mode: str, reshard: bool, dp_shard: int, world: int = 2
) -> dict:
    """FSDP2 on `world` gloo workers, frozen weights placed by `train.frozen_params=frozen_mode`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(vlm_dir) / "fsdp.json"
    with environment(worker_env_vars(os.environ)):  # as the trainer's workers get it
        mp.start_processes(
            _rank, args=(world, port, vlm_dir, steps, str(out), frozen_mode, reshard, dp_shard), nprocs=world,
            start_method="spawn",
        )  # fmt: skip
    result = json.loads(out.read_text())
    return {
        "frozen_params": f"{frozen_mode} -> {result['placement']}",
        "step_s": statistics.median(result["times"]),
        "peak_rss_mb": result["rss"],
        "comm_bytes_per_step": result["comm"],
    }


def interleaved_rounds(vlm_dir: str, args: argparse.Namespace, reshard: bool) -> dict:
    """`args.rounds` rounds of the plain process (the workers' environment, and the caller's
    where that differs) and FSDP2 with frozen weights placed by `args.frozen_params`, each in
    fresh processes, the order alternating; each round's ratio against its own plain step."""
    worker_env = worker_env_vars(os.environ)
    caller_env = {HUGE_PAGES_ENV: os.environ.get(HUGE_PAGES_ENV)}  # None: unset
    plains = {"plain": worker_env}
    if caller_env != worker_env:
        plains["plain_caller_env"] = caller_env
    rounds, first_plain = [], None
    for index in range(args.rounds):
        sides = [*plains, "fsdp"]
        row = {"order": sides if index % 2 == 0 else sides[::-1]}
        for side in row["order"]:
            if side == "fsdp":
                row["fsdp"] = fsdp(vlm_dir, args.steps, args.frozen_params, reshard, args.dp_shard)
            else:
                timed = plain_in_fresh_process(
                    vlm_dir, args.steps, plains[side], count_flops=first_plain is None
                )
                first_plain = first_plain or timed
                row[side] = {
                    "step_s": timed["plain_step_s"],
                    "peak_rss_mb": timed["plain_peak_rss_mb"],
                }
        for side in plains:
            row[f"fsdp_over_{side}"] = row["fsdp"]["step_s"] / row[side]["step_s"]
        rounds.append(row)
    out = {k: v for k, v in first_plain.items() if k not in ("plain_step_s", "samples_per_s")}
    out["plain_step_s"] = statistics.median(r["plain"]["step_s"] for r in rounds)
    out["plain_env"] = worker_env
    out[f"fsdp_frozen_{args.frozen_params}_step_s"] = statistics.median(
        r["fsdp"]["step_s"] for r in rounds
    )
    out["fsdp_over_plain_step_time"] = statistics.median(r["fsdp_over_plain"] for r in rounds)
    out["fsdp_over_plain_step_time_per_round"] = [r["fsdp_over_plain"] for r in rounds]
    if "plain_caller_env" in plains:
        out["caller_env"] = caller_env
        out["fsdp_over_caller_env_plain_step_time"] = statistics.median(
            r["fsdp_over_plain_caller_env"] for r in rounds
        )
    out["rounds"] = rounds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side")
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="interleaved rounds of the plain and FSDP2 sides (CPU); the ratio is their median",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    shipped = "true" if load_config().train.reshard_after_forward else "false"
    parser.add_argument(
        "--reshard-after-forward", choices=["true", "false"], default=shipped,
        help="train.reshard_after_forward of the FSDP side (false: one all-gather per step); "
        f"default: the default config's ({shipped})",
    )  # fmt: skip
    parser.add_argument(
        "--dp-shard", type=int, default=0,
        help="train.dp_shard of the FSDP side (1: HSDP with the trained weights replicated)",
    )  # fmt: skip
    parser.add_argument(
        "--frozen-params", choices=["auto", "replicate"], default="auto",
        help="train.frozen_params of the FSDP side timed against the plain process",
    )  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    with tempfile.TemporaryDirectory() as vlm_dir:
        (Path(vlm_dir) / "config.json").write_text(json.dumps(SMOLVLM2_500M))
        with torch.device("meta"):
            family, config = resolve(vlm_dir)
            skeleton = meta_model(family, config)
        result = {
            "model": "SmolVLA on SmolVLM2-500M-Video-Instruct dims (random init)",
            "kept_text_layers": config.num_vlm_layers,
            "expert_width": int(960 * config.expert_width_multiplier),
            "params_by_role": {},
        }
        for name, param in skeleton.named_parameters():
            role = skeleton.role_of(name)
            result["params_by_role"][role] = result["params_by_role"].get(role, 0) + param.numel()
        del skeleton
        if args.device != "cpu":
            result.update(plain(vlm_dir, args.steps, args.device, args.precision))
        else:
            reshard = args.reshard_after_forward == "true"
            result.update(interleaved_rounds(vlm_dir, args, reshard))
            # The old behaviour (frozen weights sharded and gathered every step), once.
            result["fsdp_frozen_shard"] = fsdp(vlm_dir, args.steps, "shard", reshard, args.dp_shard)
            result["fsdp_sharded_frozen_over_plain_step_time"] = (
                result["fsdp_frozen_shard"]["step_s"] / result["plain_step_s"]
            )
            # What 2 processes cost on these CPUs before any communication or FSDP hook.
            result["independent_processes"] = independent(vlm_dir, args.steps)
            floor = result["independent_processes"]["step_s"]
            after = result[f"fsdp_frozen_{args.frozen_params}_step_s"]
            result["independent_processes_over_plain_step_time"] = floor / result["plain_step_s"]
            result["fsdp_over_independent_step_time"] = after / floor
    result["spawned_process_env"] = worker_env_vars(os.environ)
    result["device"] = args.device
    result["reshard_after_forward"] = args.reshard_after_forward
    result["dp_shard"] = args.dp_shard
    result["precision"] = args.precision
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
