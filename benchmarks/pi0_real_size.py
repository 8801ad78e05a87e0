"""pi0 and pi0.5 (LeRobot 0.6.1) at their real size, random weights, no download.

Everything but `--measure` runs on the meta device (nothing allocated, seconds):

* parameters: the state dict's values and tensors under LeRobot's key names (`lerobot_io.key_map`),
  against LeRobot's figures (tensor count of its `model.safetensors`, published parameter count),
  with and without the two LM heads that LeRobot stores but no output uses;
* a per-rank memory table for a FULL fine-tune (every parameter trains: fp32 master weights, fp32
  gradients, AdamW's two fp32 states; bf16 compute) under FSDP2 full sharding at world sizes
  1-16, 3 cameras at 224 x 224: model state / W, the largest unit FSDP gathers (bf16, twice for
  prefetch) and its unsharded fp32 gradient, and activations per sample counted from the
  autograd graph of one meta forward (bf16), without and with activation checkpointing;
* `--dump-keys FILE`: LeRobot's key -> [shape, dtype] of both real-size state dicts.

`--measure` times one `train_expert_only` training step on this CPU machine (about 5 minutes per
variant at real size on 2 idle cores): one process against 2 gloo workers (FSDP2: `apply_fsdp` +
`StepRunner`), global batch 2 (1 sample per worker), one camera, frozen weights stored in bf16 and
trainable ones in fp32 (no autocast). The two run one after the other, each in its own spawned
process, so peak RSS (VmHWM) is that setup's alone. Weights are random (`to_empty`, then small
normal values in place, shard by shard under FSDP2); nothing is built twice. Should FSDP2 refuse
frozen bf16 and trainable fp32 in one unit, the error is reported and the workers rerun with fp32
storage and `precision=bf16` (FSDP2 mixed precision); the output says which ran. `--scale-down N`
divides every width and depth by N (a quick check of the whole script). Peak RSS at real size (GB =
1e9 B throughout): pi0 15 GB (one process) and 11.5-11.7 GB per worker, pi0.5 17.5 GB and more than
12 GB per worker, which two workers on a 24 GiB machine do not have; with
`MALLOC_MMAP_THRESHOLD_=65536` in the environment (inherited by the spawned processes, recorded in
the output) glibc hands freed buffers back and pi0.5's workers peak at 10.2 GB, at the price of
steps about 1.5x slower on both sides.

    python benchmarks/pi0_real_size.py                          # counts and memory table
    python benchmarks/pi0_real_size.py --dump-keys keys.json    # plus LeRobot's keys and shapes
    python benchmarks/pi0_real_size.py --measure --steps 2      # plus the CPU step (minutes)
    python benchmarks/pi0_real_size.py --measure --scale-down 8 # the same, small, in seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from raytrain_vla.config.schema import OptimizerConfig, SchedulerConfig, TrainConfig
from raytrain_vla.models.pi_gemma import lerobot_io
from raytrain_vla.models.pi_gemma.config import DEFAULT_NORM, DEFAULT_TOKENS, PiConfig
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.flops import training_flops_per_sample
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.materialize import meta_model
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.rank_exit import exit_rank
from raytrain_vla.train.step import StepRunner

VARIANTS = ("pi0", "pi05")
# LeRobot 0.6.1: tensors in model.safetensors; the parameter count its docs / model cards give.
LEROBOT = {
    "pi0": {"state_dict_tensors": 778, "published_params": 3.50e9},
    "pi05": {"state_dict_tensors": 813, "published_params": 3.62e9},
}
WORLD_SIZES = (1, 2, 4, 8, 16)
GPU_BYTES = 80e9  # "80 GB" GPU, taken as 80e9 bytes (an H100 80GB has 85.5e9; CUDA takes some)
CHUNK = 50
FULL_FT_CAMERAS, MEASURE_CAMERAS = 3, 1
# Bytes per parameter of a full fine-tune's model state: fp32 weights, fp32 grads, AdamW m and v.
STATE_BYTES = {"params": 4, "grads": 4, "optimizer": 8}
GB = 1e9


# --- configs and meta models -----------------------------------------------------------------


def scaled_dims(scale: int) -> dict:
    """Every width and depth divided by `scale` (1: LeRobot's real size, PiConfig's defaults)."""
    if scale == 1:
        return {}
    d = PiConfig()

    def div(v: int, multiple: int = 1) -> int:
        return max(multiple, (v // scale) // multiple * multiple)

    return {
        "vlm_width": div(d.vlm_width, 8),
        "vlm_mlp_dim": div(d.vlm_mlp_dim, 8),
        "expert_width": div(d.expert_width, 8),
        "expert_mlp_dim": div(d.expert_mlp_dim, 8),
        "depth": div(d.depth),
        "head_dim": div(d.head_dim, 2),
        "vision_width": div(d.vision_width, d.vision_heads),
        "vision_layers": div(d.vision_layers),
        "vision_mlp_dim": div(d.vision_mlp_dim, 8),
        "vocab_size": div(d.vocab_size, 8),
    }


def make_config(
    variant: str, cameras: int = FULL_FT_CAMERAS, scale: int = 1, expert_only: bool = False
) -> PiConfig:
    cams = tuple(f"observation.images.camera{i}" for i in range(cameras))
    return PiConfig(
        variant=variant,
        cameras=cams,
        camera_sources=cams,
        camera_shapes=((3, 224, 224),) * cameras,
        state_dim=8,
        action_dim=7,
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        tokenizer_max_length=DEFAULT_TOKENS[variant],  # pi0: 48, pi0.5: 200
        norm_map=dict(DEFAULT_NORM[variant]),
        train_expert_only=expert_only,
        **scaled_dims(scale),
    )


def build_meta(config: PiConfig) -> nn.Module:
    return meta_model(get_family(config.variant), config)


def make_batch(config: PiConfig, n: int, device: str | torch.device, seed: int = 0) -> dict:
    """A collated batch as the processor makes it (images at 224 x 224 in [-1, 1])."""
    length = config.tokenizer_max_length
    if str(device) == "meta":
        images = {c: torch.empty((n, 3, 224, 224), device="meta") for c in config.cameras}
        state, actions = (
            torch.empty((n, 32), device="meta"),
            torch.empty((n, CHUNK, 32), device="meta"),
        )
        tokens = torch.zeros((n, length), dtype=torch.long, device="meta")
    else:
        g = torch.Generator().manual_seed(seed)
        images = {c: torch.rand((n, 3, 224, 224), generator=g) * 2 - 1 for c in config.cameras}
        state, actions = torch.randn((n, 32), generator=g), torch.randn((n, CHUNK, 32), generator=g)
        tokens = torch.randint(2, config.vocab_size, (n, length), generator=g)
    return {
        "images": images,
        "image_masks": {c: torch.ones(n, dtype=torch.bool, device=device) for c in config.cameras},
        "lang_tokens": tokens,
        "lang_masks": torch.ones((n, length), dtype=torch.bool, device=device),
        "state": state,
        "actions": actions,
        "action_is_pad": torch.zeros((n, CHUNK), dtype=torch.bool, device=device),
        "sample_ids": torch.arange(seed * n, seed * n + n, device=device),
    }


# --- 1. parameters -------------------------------------------------------------------------------


def parameter_counts(variant: str, scale: int) -> dict:
    model = build_meta(make_config(variant, scale=scale))
    state = model.state_dict()
    total = sum(t.numel() for t in state.values())
    vlm_head = state["lm_heads.vlm.weight"].numel()
    expert_head = state["lm_heads.expert.weight"].numel()
    keys = lerobot_io.key_map(model)
    out = {
        "state_dict_values": total,
        "state_dict_tensors": len(state),
        "lerobot_keys": len(set(keys.values())),
        "lm_head_values": {"paligemma": vlm_head, "expert": expert_head},
        "without_both_lm_heads": total - vlm_head - expert_head,
        "without_paligemma_lm_head": total - vlm_head,
        "roles": {},
    }
    for name, param in model.named_parameters():
        role = model.role_of(name)
        out["roles"][role] = out["roles"].get(role, 0) + param.numel()
    # What gets no gradient even in a full fine-tune (LeRobot's too): the LM heads, the VLM's
    # final norm and the parts of its last layer no action token reads.
    out["no_gradient_in_full_fine_tune"] = sum(
        model.get_parameter(n).numel() for n in model.frozen_parameters()
    )
    expert_only = build_meta(make_config(variant, scale=scale, expert_only=True))
    out["trainable_train_expert_only"] = sum(
        p.numel()
        for n, p in expert_only.named_parameters()
        if n not in expert_only.frozen_parameters()
    )
    if scale == 1:
        ref = LEROBOT[variant]
        out["lerobot_0.6.1"] = dict(ref)
        out["tensors_match_lerobot"] = len(state) == ref["state_dict_tensors"]
        out["published_over_ours"] = {
            "without_paligemma_lm_head": ref["published_params"] / out["without_paligemma_lm_head"],
            "without_both_lm_heads": ref["published_params"] / out["without_both_lm_heads"],
        }
    return out


def dump_keys(path: Path) -> None:
    """LeRobot key -> [shape, dtype] of the real-size state dicts (meta; nothing allocated)."""
    out = {}
    for variant in VARIANTS:
        model = build_meta(make_config(variant))
        names = lerobot_io.key_map(model)
        out[variant] = {
            "keys": {
                names[name]: [list(t.shape), str(t.dtype).removeprefix("torch.")]
                for name, t in model.state_dict().items()
            }
        }
    path.write_text(json.dumps(out, indent=1))


# --- 3. the full fine-tune memory table ----------------------------------------------------------


def activation_bytes(model: nn.Module, config: PiConfig) -> dict:
    """Per-sample bytes autograd saves for backward in one bf16 forward on meta, every parameter
    trainable; parameters themselves are not counted (FSDP gathers them again in backward).

    With activation checkpointing (the project's `activation_checkpoint_units`: SigLIP blocks and
    joint layers) what stays is everything saved outside those units, each unit's inputs, and
    one unit's own saves while it is recomputed in backward (the largest)."""
    model = model.to(torch.bfloat16)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    units = model.activation_checkpoint_units()
    bucket = {"unit": None}
    # Keyed by storage; every tensor is kept referenced so no key is reused while counting.
    saved: dict[int, tuple[object, int, torch.Tensor]] = {}
    unit_inputs: dict[int, tuple[int, torch.Tensor]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in params and key not in saved:
            saved[key] = (bucket["unit"], t.untyped_storage().nbytes(), t)
        return t

    def enter(index: int):
        def hook(module, args, kwargs):
            bucket["unit"] = index
            for a in [*args, *kwargs.values()]:
                if isinstance(a, torch.Tensor):
                    unit_inputs[a.untyped_storage()._cdata] = (a.untyped_storage().nbytes(), a)

        return hook

    def leave(module, args, output):
        bucket["unit"] = None

    handles = []
    for i, unit in enumerate(units):
        handles.append(unit.register_forward_pre_hook(enter(i), with_kwargs=True))
        handles.append(unit.register_forward_hook(leave))
    ran = set()
    for unit in model.fsdp_units():
        handles.append(unit.register_forward_pre_hook(lambda m, a, u=unit: ran.add(id(u))))
    n = 1
    batch = make_batch(config, n, "meta")
    noise, t = torch.empty((n, CHUNK, 32), device="meta"), torch.empty((n,), device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = model(batch, noise, t)
    for h in handles:
        h.remove()
    per_unit: dict = {}
    for unit, nbytes, _ in saved.values():
        per_unit[unit] = per_unit.get(unit, 0) + nbytes
    outside = per_unit.pop(None, 0)
    del loss
    return {
        "no_checkpointing": (outside + sum(per_unit.values())) / n,
        "activation_checkpointing": (
            outside + sum(b for b, _ in unit_inputs.values()) + max(per_unit.values())
        )
        / n,
        "units_run": ran,
    }


def memory_table(variant: str, scale: int) -> dict:
    config = make_config(variant, scale=scale)
    model = build_meta(config)
    total = sum(p.numel() for p in model.parameters())
    no_grad = sum(model.get_parameter(n).numel() for n in model.frozen_parameters())
    acts = activation_bytes(model, config)
    units = model.fsdp_units()
    size = {id(u): sum(p.numel() for p in u.parameters()) for u in units}
    name_of = {id(m): n for n, m in model.named_modules()}
    largest = max(units, key=lambda u: size[id(u)])
    gathered = max((u for u in units if id(u) in acts["units_run"]), key=lambda u: size[id(u)])
    seq = config.tokens_per_camera * len(config.cameras) + config.tokenizer_max_length
    suffix = CHUNK if config.adarms else CHUNK + 1
    fixed_gather = 2 * size[id(gathered)] * 2  # bf16, this unit and the one prefetched
    grad_buffer = size[id(gathered)] * 4  # its unsharded gradient, reduce-scattered in fp32
    rows = []
    for world in WORLD_SIZES:
        state = {k: total * b / world for k, b in STATE_BYTES.items()}
        base = sum(state.values()) + fixed_gather + grad_buffer
        row = {
            "world_size": world,
            **{f"{k}_gb": v / GB for k, v in state.items()},
            "gathered_bf16_x2_gb": fixed_gather / GB,
            "unsharded_grad_fp32_gb": grad_buffer / GB,
            "activations_per_sample_gb": acts["no_checkpointing"] / GB,
            "total_micro_batch_1_gb": (base + acts["no_checkpointing"]) / GB,
            "fits_80gb_micro_batch_1": base + acts["no_checkpointing"] <= GPU_BYTES,
            "fits_80gb_micro_batch_1_ac": base + acts["activation_checkpointing"] <= GPU_BYTES,
            "max_micro_batch": max(0, math.floor((GPU_BYTES - base) / acts["no_checkpointing"])),
            "max_micro_batch_ac": max(
                0, math.floor((GPU_BYTES - base) / acts["activation_checkpointing"])
            ),
            # The same with no state for what gets no gradient (LM heads, ...): AdamW keeps none
            # for a parameter whose .grad stays None.
            "total_micro_batch_1_grad_receiving_only_gb": (
                base
                + acts["no_checkpointing"]
                - no_grad * (STATE_BYTES["grads"] + STATE_BYTES["optimizer"]) / world
            )
            / GB,
        }
        rows.append(row)
    return {
        "cameras": len(config.cameras),
        "prefix_tokens": seq,
        "suffix_tokens": suffix,
        "params": total,
        "params_without_gradient": no_grad,
        "largest_fsdp_unit": {"name": name_of[id(largest)], "params": size[id(largest)]},
        "largest_gathered_unit": {"name": name_of[id(gathered)], "params": size[id(gathered)]},
        "activations_per_sample_gb": {
            "no_checkpointing": acts["no_checkpointing"] / GB,
            "activation_checkpointing": acts["activation_checkpointing"] / GB,
        },
        "rows": rows,
    }


# --- 4. the measured train_expert_only step ------------------------------------------------------


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: a spawned process's own)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    raise RuntimeError("no VmHWM in /proc/self/status")


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def init_random(model: nn.Module, seed: int) -> None:
    """Small random values in place (each rank fills its own shards): matrices N(0, 0.02),
    LayerNorm weights 1, every other vector 0 (Gemma's RMSNorm scales by 1 + w)."""
    g = torch.Generator().manual_seed(seed)
    ones = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.LayerNorm) and m.weight is not None
    }
    for param in model.parameters():
        local = _local(param)
        if local.dim() >= 2:
            local.normal_(0.0, 0.02, generator=g)
        elif id(param) in ones:
            local.fill_(1.0)
        else:
            local.zero_()


def build_expert_only(
    config: PiConfig, storage: str, world: int = 1, precision: str = "fp32"
) -> nn.Module:
    """The `train_expert_only` model on CPU with random weights: built on meta, frozen
    parameters cast to bf16 there (storage "bf16-frozen"), sharded when `world` > 1, then
    allocated once (`to_empty`) and filled."""
    model = build_meta(config)
    freeze_for_config(model, OptimizerConfig())
    if storage == "bf16-frozen":
        for param in model.parameters():
            if not param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    if world > 1:
        apply_fsdp(model, init_device_mesh("cpu", (world,)), TrainConfig(precision=precision))
    model.to_empty(device="cpu")
    init_random(model, seed=dist.get_rank() if world > 1 else 0)
    return model


def held_bytes(model: nn.Module) -> dict:
    """Bytes of parameters (local shards under FSDP2) by dtype."""
    out: dict[str, int] = {}
    for p in model.parameters():
        local = _local(p)
        key = str(local.dtype).removeprefix("torch.")
        out[key] = out.get(key, 0) + local.numel() * local.element_size()
    return out


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        _local(v).numel() * _local(v).element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def _measure(rank: int, world: int, port: int, args: dict) -> None:
    """One setup in a spawned process: world 1 is the plain process (2 threads), otherwise a
    gloo rank (1 thread each). Writes its figures (or its error) to `args["out"]`.rank."""
    out = Path(f"{args['out']}.{rank}")
    try:
        if world > 1:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group(
                "gloo", rank=rank, world_size=world, timeout=timedelta(minutes=40)
            )
            torch.set_num_threads(1)
        config = make_config(args["variant"], MEASURE_CAMERAS, args["scale"], expert_only=True)
        start = time.perf_counter()
        model = build_expert_only(config, args["storage"], world, args["precision"])
        build_s = time.perf_counter() - start
        optim_cfg = OptimizerConfig(lr=1e-5, groups=[])
        groups = resolve_groups(model, optim_cfg)
        optimizer = build_optimizer(model, groups, optim_cfg)
        steps = args["steps"]
        scheduler = build_scheduler(
            optimizer, steps + 1, SchedulerConfig(type="constant", warmup_steps=0)
        )

        def noise_fn(step: int, ids: list[int]):
            return flow_noise_and_time(0, step, ids, model.noise_shape)

        runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, grad_clip=1.0)
        per_rank = 2 // world
        times, losses = [], []
        for step in range(steps + 1):  # the first step warms up (and allocates AdamW's state)
            micro = make_batch(config, per_rank, "cpu", seed=step * 8 + rank)
            t0 = time.perf_counter()
            metrics = runner.run(step, [micro])
            times.append(time.perf_counter() - t0)
            losses.append(metrics["loss"])
        result = {
            "build_and_init_s": build_s,
            "warmup_step_s": times[0],
            "step_s": times[1:],
            "losses": losses,
            "param_bytes_by_dtype": held_bytes(model),
            "optimizer_state_bytes": optimizer_bytes(optimizer),
            "peak_rss_gb": peak_rss_gb(),
            "threads": torch.get_num_threads(),
            "load_avg_1min_after": os.getloadavg()[0],
        }
    except Exception as err:  # noqa: BLE001 - reported, and FSDP's refusal triggers the fallback
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    out.write_text(json.dumps(result))
    if world > 1:
        exit_rank(wait_for_peers="error" not in result)  # a failed peer never reaches the barrier


def spawn(world: int, args: dict) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_measure, args=(world, port, args), nprocs=world, start_method="spawn")
    return [json.loads(Path(f"{args['out']}.{r}").read_text()) for r in range(world)]


def summarize(ranks: list[dict]) -> dict:
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        return {"error": errors[0], "traceback": ranks[0].get("traceback", "")}
    step = statistics.median(
        statistics.mean(r["step_s"][i] for r in ranks) for i in range(len(ranks[0]["step_s"]))
    )
    return {
        "step_s": step,
        "step_s_each": [r["step_s"] for r in ranks],
        "warmup_step_s": max(r["warmup_step_s"] for r in ranks),
        "build_and_init_s": max(r["build_and_init_s"] for r in ranks),
        "losses": ranks[0]["losses"],
        "peak_rss_gb": [r["peak_rss_gb"] for r in ranks],
        "param_gb_per_rank": [sum(r["param_bytes_by_dtype"].values()) / GB for r in ranks],
        "param_bytes_by_dtype": [r["param_bytes_by_dtype"] for r in ranks],
        "optimizer_state_gb_per_rank": [r["optimizer_state_bytes"] / GB for r in ranks],
        "threads_per_process": ranks[0]["threads"],
        "machine_load_avg_1min_after": ranks[0]["load_avg_1min_after"],
    }


def progress(label: str, figures: dict) -> None:
    """Each setup's figures on stderr as soon as they exist (a long run that dies later keeps
    them)."""
    print(f"{label}: {json.dumps(figures)}", file=sys.stderr, flush=True)


def measure(variant: str, scale: int, steps: int, tmp: str) -> dict:
    base = {"variant": variant, "scale": scale, "steps": steps}
    config = make_config(variant, MEASURE_CAMERAS, scale, expert_only=True)
    skeleton = build_meta(config)
    freeze_for_config(skeleton, OptimizerConfig())
    flops = training_flops_per_sample(skeleton, make_batch(config, 1, "meta"))
    del skeleton
    result: dict = {
        "cameras": MEASURE_CAMERAS,
        "tokens": {
            "prefix": config.tokens_per_camera + config.tokenizer_max_length,
            "suffix": CHUNK if config.adarms else CHUNK + 1,
        },
        "global_batch": 2,
        "train_flops_per_sample": flops,
    }
    args = {**base, "storage": "bf16-frozen", "precision": "fp32", "out": f"{tmp}/{variant}-plain"}
    result["mem_available_gb_before"] = mem_available_gb()
    plain = summarize(spawn(1, args))
    plain["storage"] = "frozen bf16, trainable fp32, no autocast"
    result["plain"] = plain
    progress(f"{variant} plain", plain)
    args.update(out=f"{tmp}/{variant}-fsdp")
    fsdp = summarize(spawn(2, args))
    fsdp["storage"] = "frozen bf16, trainable fp32, no autocast (fp32 FSDP policy)"
    if "error" in fsdp:
        result["fsdp_bf16_frozen_error"] = fsdp["error"]
        args.update(storage="fp32", precision="bf16", out=f"{tmp}/{variant}-fsdp-fp32")
        fsdp = summarize(spawn(2, args))
        fsdp["storage"] = "fp32 storage, precision=bf16 (FSDP2 mixed precision, fp32 reduction)"
    result["fsdp_2_gloo_workers"] = fsdp
    progress(f"{variant} fsdp", fsdp)
    if "error" not in plain and "error" not in fsdp:
        result["fsdp_over_plain_step"] = fsdp["step_s"] / plain["step_s"]
        result["plain_samples_per_s"] = 2 / plain["step_s"]
        result["plain_gflops_per_s"] = 2 * flops / plain["step_s"] / 1e9
        result["fsdp_param_gb_per_rank_over_plain"] = [
            p / plain["param_gb_per_rank"][0] for p in fsdp["param_gb_per_rank"]
        ]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default="pi0,pi05", help="comma-separated: pi0, pi05")
    parser.add_argument("--dump-keys", type=Path, help="write LeRobot's keys, shapes, dtypes here")
    parser.add_argument(
        "--measure", action="store_true", help="time a train_expert_only step on CPU (minutes)"
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps (after 1 warm-up)")
    parser.add_argument(
        "--scale-down", type=int, default=1, help="divide widths and depths by N (quick check)"
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; expected {VARIANTS}")
    if args.dump_keys:
        dump_keys(args.dump_keys)
    result: dict = {
        "scale_down": args.scale_down,
        "torch": torch.__version__,
        # glibc: allocations above this size are mmap'd and go back to the OS when freed
        # (smaller peak RSS, slower steps); the spawned measurement processes inherit it.
        "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }
    for variant in variants:
        entry = {"parameters": parameter_counts(variant, args.scale_down)}
        entry["full_fine_tune_memory"] = memory_table(variant, args.scale_down)
        if args.measure:
            with tempfile.TemporaryDirectory() as tmp:
                entry["measured_train_expert_only_cpu"] = measure(
                    variant, args.scale_down, args.steps, tmp
                )
        result[variant] = entry
    result["assumptions"] = {
        "memory_table": (
            "full fine-tune, every parameter trainable (fp32 weights, fp32 grads, AdamW m and v "
            "in fp32 = 16 B/param, divided by W), FSDP2 full sharding, bf16 compute; gathered = "
            "the largest unit whose forward runs, in bf16, twice (prefetch), plus its unsharded "
            "gradient in fp32 for the reduce-scatter; activations per sample = the bytes autograd "
            "saves in one bf16 forward on meta (3 cameras; SigLIP's SDPA and Gemma's eager "
            "attention as they run on CPU: the attention probabilities are counted, a fused "
            "flash kernel would not save them); not counted: the backward pass's transient "
            "activation gradients, the CUDA context, allocator fragmentation. 80 GB = 80e9 B."
        ),
        "grad_receiving_only": (
            "the LM heads, the VLM's final norm and half of its last layer get no gradient "
            "(LeRobot's either), so AdamW keeps no state for them"
        ),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
