"""Does LeRobot's own pi0 / pi0.5 learn the demo task where ours does not? Both, side by side.

Issue 44: at the learning check's dimensions (`benchmarks/pi_learning_check.sh`) our pi0 and
pi0.5 end worse than the mean action. This trains, in one invocation:

* ours: `raytrain_vla`'s model, processor, optimizer groups, scheduler and `StepRunner`, built
  from the learning check's overrides through `load_config` (one process, no Ray, no FSDP);
* LeRobot's: LeRobot 0.6.1's `PI05Policy` / `PI0Policy` at the same dimensions (the tiny
  fixture's `apply_tiny_patch`), fresh weights, `make_pre_post_processors(dataset_stats=...)`
  and `policy.forward`'s loss (its own noise and time), in a subprocess in LeRobot's venv
  (`--lerobot-python`, see `benchmarks/lerobot_crosscheck.py` for how it is installed).

Same data (the demo dataset's training episodes, read once by our `LeRobotSource`), same
sample order (our `SamplePlan`'s global batches, full shuffle), same recipe (AdamW with the
default groups' LR, betas, eps and weight decay, the default linear warm-up then a constant
LR, gradient clipping at the default norm, the default global batch; with
`--optimizer.type=muon` LeRobot's side runs torch.optim.Muon over the 2-D nn.Linear weights
that `optimizer.muon.exclude_patterns` leaves, as ours splits them, and AdamW over the rest;
both sides report the split), same held-out samples
scored with `train/validate.py`'s `val_mse_ratio` (action MSE over the non-padded chunk steps in
the robot's units, over the mean action's) and the same validation noise. Both sides' training
loss is averaged every `--log-every` steps, and `inputs_max_abs_diff` compares what reaches each
model for step 0's batch (image in [-1, 1], prompt tokens and mask, normalised actions and
state). Prints one JSON object; progress goes to stderr.

    python benchmarks/pi_lerobot_side_by_side.py --variant pi05 --steps 3000 \\
        --lerobot-python /tmp/lrv/bin/python
    # the learning check's recipe (benchmarks/pi_learning_check.sh):
    python benchmarks/pi_lerobot_side_by_side.py --variant pi05 --steps 3000 \\
        --optimizer.type=muon --optimizer.groups=[] --optimizer.lr=3e-3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CAMERA = "observation.image"  # the demo dataset's one camera
VAL_CHUNK = 64  # samples per validation forward
# The options that size the model, handed to LeRobot's side.
DIMS = (
    "vlm_width", "vlm_mlp_dim", "expert_width", "expert_mlp_dim", "depth", "head_dim",
    "vision_width", "vision_layers", "vision_heads", "vision_mlp_dim", "patch_size",
    "vocab_size", "image_resolution", "tokenizer_max_length", "num_inference_steps",
)  # fmt: skip


def learning_check_overrides(
    variant: str, fixtures: Path, root: str, extra: list[str]
) -> list[str]:
    """What `benchmarks/pi_learning_check.sh` passes to `raytrain_vla.run` (minus Ray's keys)."""
    pi = variant
    dims = {
        "vlm_width": 64, "vlm_mlp_dim": 128, "expert_width": 48, "expert_mlp_dim": 96,
        "depth": 3, "head_dim": 16, "vision_width": 32, "vision_layers": 2, "vision_heads": 2,
        "vision_mlp_dim": 64, "patch_size": 8, "vocab_size": 512, "image_resolution": "[32,32]",
        "tokenizer_max_length": 64, "num_inference_steps": 4,
    }  # fmt: skip
    out = [f"--model.type={pi}", f"--model.{pi}.tokenizer_path={tokenizer_dir(fixtures, pi)}"]
    out += [f"--model.{pi}.{k}={v}" for k, v in dims.items()]
    out += ["--data.chunk_size=10", "--scheduler.type=constant", "--data.shuffle_window=1000000"]
    if root:
        out.append(f"--data.root={root}")
    return out + list(extra)


def tokenizer_dir(fixtures: Path, variant: str) -> Path:
    return (fixtures / f"lerobot_{variant}_tiny" / "tokenizer").resolve()


# --- the data both sides read ----------------------------------------------------------------


def prepare(cfg: Any, view: Any, steps: int, path: Path) -> dict[str, Any]:
    """Every frame the run can touch, decoded once by our source, plus the step order, the
    held-out ids, their validation noise and the stats; written to `path` (npz) for LeRobot."""
    from raytrain_vla.train.noise import VAL_STREAM, flow_noise_and_time

    batches = np.stack([view.plan.global_batch(s) for s in range(steps)])
    ids = np.unique(np.concatenate([batches.reshape(-1), view.val_ids]))
    cols: dict[str, list] = {}
    for start in range(0, len(ids), 1024):
        part = view.source.read(ids[start : start + 1024])
        for key, value in part.items():
            cols.setdefault(key, []).append(value)
    frames = {k: np.concatenate(v) for k, v in cols.items()}
    noise, _ = flow_noise_and_time(
        cfg.train.seed, VAL_STREAM, view.val_ids.tolist(), (cfg.data.chunk_size, 32)
    )
    stats = view.meta.stats
    data = {
        "ids": ids,
        "image": frames[f"image/{CAMERA}"],
        "state": frames["state"],
        "actions": frames["actions"],
        "action_is_pad": frames["action_is_pad"],
        "task": np.asarray(frames["task"], dtype=str),
        "batches": batches,
        "val_ids": view.val_ids,
        "val_noise": noise.numpy(),
        "mean_action": np.asarray(view.mean_action, np.float32),
    }
    for feature in (CAMERA, "observation.state", "action"):
        for stat, value in stats[feature].items():
            data[f"stats/{feature}/{stat}"] = np.asarray(value, np.float32)
    np.savez(path, **data)
    return data


def rows(data: dict[str, Any], sample_ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(data["ids"], sample_ids)


def columns(data: dict[str, Any], sample_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Our read's columns for these samples (what a Ray Data read task hands the processor)."""
    r = rows(data, sample_ids)
    return {
        "sample_id": np.asarray(sample_ids, np.int64),
        "state": data["state"][r],
        "actions": data["actions"][r],
        "action_is_pad": data["action_is_pad"][r],
        "task": data["task"][r].astype(object),
        f"image/{CAMERA}": data["image"][r],
    }


def ratio(pred: np.ndarray, true: np.ndarray, pad: np.ndarray, mean_action: np.ndarray) -> dict:
    """`train/validate.py`'s definition: per-dimension MSE over valid chunk steps, averaged over
    dimensions, over the same for the mean action."""
    valid = (~pad)[..., None].astype(np.float64)
    n = valid.sum()
    mse = (((pred - true) ** 2) * valid).sum((0, 1)) / n
    base = (((mean_action - true) ** 2) * valid).sum((0, 1)) / n
    return {
        "val_action_mse": float(mse.mean()),
        "val_mean_action_mse": float(base.mean()),
        "val_mse_ratio": float(mse.mean() / max(base.mean(), 1e-12)),
    }


def muon_matrix_names(model: Any, exclude_patterns: list[str]) -> set[str]:
    """`train/muon.muon_parameter_names`' rule (2-D nn.Linear weights no pattern matches), for
    LeRobot's module names, which this side cannot import ours to compute."""
    import torch

    patterns = [re.compile(p) for p in exclude_patterns]
    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.weight.ndim == 2:
            name = f"{module_name}.weight" if module_name else "weight"
            if not any(p.search(name) for p in patterns):
                names.add(name)
    return names


def split_counts(matrices: list[Any], rest: list[Any]) -> dict[str, int]:
    """How many tensors and values each half of the optimizer holds, to compare the sides."""
    return {
        "muon_tensors": len(matrices), "muon_params": sum(p.numel() for p in matrices),
        "adamw_tensors": len(rest), "adamw_params": sum(p.numel() for p in rest),
    }  # fmt: skip


def lr_factor(step: int, warmup: int) -> float:
    """The default scheduler with `scheduler.type=constant` (`train/optim.py`)."""
    return (step + 1) / warmup if warmup > 0 and step < warmup else 1.0


# --- ours --------------------------------------------------------------------------------------


def our_side(cfg: Any, view: Any, data: dict[str, Any], args: argparse.Namespace) -> dict:
    import torch

    from raytrain_vla.models.registry import get_family
    from raytrain_vla.train.init_source import build_init_source
    from raytrain_vla.train.noise import flow_noise_and_time
    from raytrain_vla.train.optim import (
        build_optimizer,
        build_scheduler,
        freeze_for_config,
        resolve_groups,
    )
    from raytrain_vla.train.step import StepRunner
    from raytrain_vla.train.validate import validate

    torch.set_num_threads(args.threads)
    torch.manual_seed(cfg.train.seed)
    family = get_family(cfg.model.type)
    config = family.resolve_config(cfg.model.options, view.spec)
    processor = family.processor(config, view.normalizer)
    model = build_init_source(family, config, cfg.train.seed)
    freeze_for_config(model, cfg.optimizer)
    groups = resolve_groups(model, cfg.optimizer)
    optimizer = build_optimizer(model, groups, cfg.optimizer)
    scheduler = build_scheduler(optimizer, args.steps, cfg.scheduler)

    def noise_fn(step: int, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return flow_noise_and_time(cfg.train.seed, step, ids, model.noise_shape)

    runner = StepRunner(model, optimizer, scheduler, groups, noise_fn, cfg.train.grad_clip)

    def batch(ids: np.ndarray) -> dict:
        return processor.collate(processor.encode(columns(data, ids)), "cpu")

    val = [
        (
            batch(data["val_ids"][i : i + VAL_CHUNK]),
            torch.ones(len(data["val_ids"][i : i + VAL_CHUNK])),
        )
        for i in range(0, len(data["val_ids"]), VAL_CHUNK)
    ]
    micro = cfg.train.micro_batch_size
    curve, vals, window = [], [], []
    start = time.perf_counter()
    for step in range(args.steps):
        ids = data["batches"][step]
        model.train()
        metrics = runner.run(step, [batch(ids[i : i + micro]) for i in range(0, len(ids), micro)])
        window.append(metrics["loss"])
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            curve.append([done, float(np.mean(window))])
            window = []
        if done % args.val_every == 0 or done == args.steps:
            model.eval()
            m = validate(model, val, processor, data["mean_action"], cfg.train.seed)
            vals.append({"step": done, **{k: m[k] for k in ("val_mse_ratio", "val_loss")}})
            print(f"ours step {done} loss {curve[-1][1]:.4f} {vals[-1]}", file=sys.stderr)
    result = {"loss_curve": curve, "val": vals, "wall_s": round(time.perf_counter() - start, 1)}
    halves: dict[bool, list] = {True: [], False: []}
    for group in optimizer.param_groups:
        halves[bool(group.get("muon"))] += group["params"]
    result["optimizer"] = split_counts(halves[True], halves[False])
    return result


def compare_inputs(cfg: Any, view: Any, data: dict[str, Any], theirs_path: Path) -> dict:
    """Largest difference between what reaches our model and LeRobot's for step 0's batch:
    the image in [-1, 1], prompt tokens and mask, normalised padded actions, normalised state
    (LeRobot pads the state inside the model, so its unpadded dims are compared)."""
    from raytrain_vla.models.registry import get_family

    family = get_family(cfg.model.type)
    config = family.resolve_config(cfg.model.options, view.spec)
    processor = family.processor(config, view.normalizer)
    ours = processor.collate(processor.encode(columns(data, data["batches"][0])), "cpu")
    theirs = dict(np.load(theirs_path))
    mine = {
        "image": next(iter(ours["images"].values())).numpy(),
        "lang_tokens": ours["lang_tokens"].numpy(),
        "lang_masks": ours["lang_masks"].numpy(),
        "actions": ours["actions"].numpy(),
        "state": ours["state"].numpy()[:, : theirs["state"].shape[1]],
    }
    out: dict[str, Any] = {}
    for key, value in mine.items():
        other = theirs[key]
        if value.shape != other.shape:
            out[key] = f"shapes {value.shape} (ours) vs {other.shape} (LeRobot)"
        else:
            diff = np.abs(value.astype(np.float64) - other.astype(np.float64))
            out[key] = float(diff.max())
    return out


# --- LeRobot's ---------------------------------------------------------------------------------


def lerobot_side(args: argparse.Namespace) -> None:
    """Runs in LeRobot's venv: no `raytrain_vla` import."""
    import torch

    torch.set_num_threads(args.threads)
    fixtures = Path(args.fixtures).resolve()
    dims = json.loads(args.dims)
    sys.path.insert(0, str(fixtures / f"lerobot_{args.variant}_tiny"))
    import make_fixture  # the fixture's generator: its dimension-only patch

    def gemma(width: int, mlp: int) -> dict:
        return {"width": width, "depth": dims["depth"], "mlp_dim": mlp, "num_heads": 8,
                "num_kv_heads": 1, "head_dim": dims["head_dim"]}  # fmt: skip

    spec = {
        "policy": args.variant,
        "vocab_size": dims["vocab_size"],
        "gemma_variants": {
            "gemma_2b": gemma(dims["vlm_width"], dims["vlm_mlp_dim"]),
            "gemma_300m": gemma(dims["expert_width"], dims["expert_mlp_dim"]),
        },
        "vision": {
            "hidden_size": dims["vision_width"], "intermediate_size": dims["vision_mlp_dim"],
            "num_hidden_layers": dims["vision_layers"],
            "num_attention_heads": dims["vision_heads"], "patch_size": dims["patch_size"],
        },
    }  # fmt: skip
    make_fixture.apply_tiny_patch(spec, tokenizer_dir(fixtures, args.variant))
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    data = dict(np.load(args.inputs))
    config_cls, policy_cls = make_fixture.policy_classes(spec)
    chunk = int(data["actions"].shape[1])
    config = config_cls(
        input_features={
            CAMERA: PolicyFeature(type=FeatureType.VISUAL, shape=tuple(data["image"].shape[1:])),
            "observation.state": PolicyFeature(
                type=FeatureType.STATE, shape=(data["state"].shape[1],)
            ),
        },
        output_features={
            "action": PolicyFeature(type=FeatureType.ACTION, shape=(data["actions"].shape[2],))
        },
        device="cpu",
        dtype="float32",
        chunk_size=chunk,
        n_action_steps=chunk,
        num_inference_steps=dims["num_inference_steps"],
        image_resolution=tuple(dims["image_resolution"]),
        tokenizer_max_length=dims["tokenizer_max_length"],
        push_to_hub=False,
    )
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, value in data.items():
        if key.startswith("stats/"):
            _, feature, stat = key.split("/")
            stats.setdefault(feature, {})[stat] = value
    torch.manual_seed(args.seed)
    policy = policy_cls(config)
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    params = [p for p in policy.parameters() if p.requires_grad]
    muon = json.loads(args.muon) if args.muon else None
    muon_names = muon_matrix_names(policy, muon["exclude_patterns"]) if muon else set()
    matrices = [p for n, p in policy.named_parameters() if n in muon_names and p.requires_grad]
    rest = [p for n, p in policy.named_parameters() if n not in muon_names and p.requires_grad]
    optimizers = [
        torch.optim.AdamW(
            rest, lr=args.lr, betas=tuple(args.betas), eps=args.eps, weight_decay=args.weight_decay
        )
    ]
    if matrices:  # torch's own Muon over LeRobot's hidden matrices, as ours splits them
        optimizers.append(
            torch.optim.Muon(
                matrices, lr=args.lr * muon["lr_scale"], weight_decay=args.weight_decay,
                momentum=muon["momentum"], nesterov=muon["nesterov"], ns_steps=muon["ns_steps"],
                adjust_lr_fn=muon["adjust_lr"],
            )
        )  # fmt: skip
    schedulers = [
        torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_factor(s, args.warmup))
        for o in optimizers
    ]

    def raw(ids: np.ndarray, with_action: bool) -> dict:
        r = rows(data, ids)
        out = {
            CAMERA: torch.from_numpy(data["image"][r]).float() / 255.0,
            "observation.state": torch.from_numpy(data["state"][r]),
            "task": [str(t) for t in data["task"][r]],
        }
        if with_action:
            out["action"] = torch.from_numpy(data["actions"][r])
            out["action_is_pad"] = torch.from_numpy(data["action_is_pad"][r])
        return out

    def validate() -> dict:
        policy.eval()
        preds = []
        with torch.no_grad():
            for i in range(0, len(data["val_ids"]), VAL_CHUNK):
                ids = data["val_ids"][i : i + VAL_CHUNK]
                noise = torch.from_numpy(data["val_noise"][i : i + VAL_CHUNK])
                preds.append(post(policy.predict_action_chunk(pre(raw(ids, False)), noise=noise)))
        policy.train()
        r = rows(data, data["val_ids"])
        pred = torch.cat(preds).numpy().astype(np.float64)
        true = data["actions"][r].astype(np.float64)
        return ratio(pred, true, data["action_is_pad"][r], data["mean_action"])

    first = pre(raw(data["batches"][0], True))  # what reaches LeRobot's model at step 0
    images, _ = policy._preprocess_images(first)
    inputs = {
        "image": images[0].numpy(),
        "lang_tokens": first["observation.language.tokens"].numpy(),
        "lang_masks": first["observation.language.attention_mask"].numpy(),
        "actions": policy.prepare_action(first).numpy(),
        "state": first["observation.state"].numpy(),
    }
    np.savez(f"{args.out}.inputs.npz", **inputs)
    curve, vals, window = [], [], []
    start = time.perf_counter()
    policy.train()
    for step in range(args.steps):
        loss, _ = policy.forward(pre(raw(data["batches"][step], True)))
        loss.backward()
        if step == 0:  # trainable tensors the loss never reaches (ours does not build them)
            unused = [n for n, p in policy.named_parameters() if p.requires_grad and p.grad is None]
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        for optimizer, scheduler in zip(optimizers, schedulers, strict=True):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        window.append(loss.item())
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            curve.append([done, float(np.mean(window))])
            window = []
        if done % args.val_every == 0 or done == args.steps:
            vals.append({"step": done, "val_mse_ratio": validate()["val_mse_ratio"]})
            print(f"lerobot step {done} loss {curve[-1][1]:.4f} {vals[-1]}", file=sys.stderr)
    result = {"loss_curve": curve, "val": vals, "wall_s": round(time.perf_counter() - start, 1)}
    result["optimizer"] = split_counts(matrices, rest)
    result["optimizer"]["unused"] = unused
    Path(args.out).write_text(json.dumps(result))


# --- driver ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", choices=["pi0", "pi05"], default="pi05")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps on each side")
    parser.add_argument("--log-every", type=int, default=100, help="loss averaged over N steps")
    parser.add_argument("--val-every", type=int, default=1000)
    parser.add_argument("--sides", choices=["both", "ours", "lerobot"], default="both")
    parser.add_argument("--lerobot-python", default="/tmp/lrv/bin/python")
    parser.add_argument("--fixtures", default=str(Path(__file__).parents[2] / "shared/fixtures"))
    parser.add_argument("--data-root", default="", help="default: the demo dataset")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side")
    # Internal: the LeRobot side's arguments (set by the driver).
    parser.add_argument("--side", choices=["driver", "lerobot"], default="driver")
    parser.add_argument("--inputs", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--dims", default="{}", help="the model's dimensions (JSON)")
    for name, kind in (("lr", float), ("eps", float), ("weight_decay", float),
                       ("grad_clip", float), ("warmup", int), ("seed", int)):  # fmt: skip
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    parser.add_argument("--betas", type=float, nargs=2, default=None)
    parser.add_argument("--muon", default="", help="Muon's settings (JSON); empty: AdamW only")
    args, overrides = parser.parse_known_args()  # the rest: --key=value for our config
    args.overrides = overrides
    if args.side == "lerobot":
        lerobot_side(args)
        return 0

    from raytrain_vla.config.loader import absolute_paths, load_config
    from raytrain_vla.data.mixture import open_view

    fixtures = Path(args.fixtures).resolve()
    cfg = absolute_paths(
        load_config(
            overrides=learning_check_overrides(
                args.variant, fixtures, args.data_root, args.overrides
            )
        )
    )
    groups = {g.lr for g in cfg.optimizer.groups} | {cfg.optimizer.lr}
    wds = {g.weight_decay for g in cfg.optimizer.groups} | {cfg.optimizer.weight_decay}
    if len(groups) != 1 or len(wds) != 1:
        raise SystemExit(f"LeRobot's side takes one LR and weight decay; ours has {groups} / {wds}")
    recipe = {
        "lr": groups.pop(), "weight_decay": wds.pop(), "betas": list(cfg.optimizer.betas),
        "eps": cfg.optimizer.eps, "warmup": cfg.scheduler.warmup_steps,
        "grad_clip": cfg.train.grad_clip, "seed": cfg.train.seed,
        "global_batch_size": cfg.train.global_batch_size, "scheduler": cfg.scheduler.type,
        "chunk_size": cfg.data.chunk_size, "shuffle_window": cfg.data.shuffle_window,
        "optimizer": cfg.optimizer.type,
    }  # fmt: skip
    if cfg.optimizer.type == "muon":
        recipe["muon"] = dataclasses.asdict(cfg.optimizer.muon)
    options = cfg.model.options
    dims = {name: getattr(options, name) for name in DIMS}
    view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    result: dict[str, Any] = {
        "variant": args.variant, "steps": args.steps, "recipe": recipe, "dims": dims,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "data.npz"
        t0 = time.perf_counter()
        data = prepare(cfg, view, args.steps, inputs)
        result["data"] = {
            "root": str(view.meta.root), "train_samples": int(view.plan.num_samples),
            "val_samples": len(view.val_ids), "read_s": round(time.perf_counter() - t0, 1),
        }  # fmt: skip
        child = None
        out = Path(tmp) / "lerobot.json"
        if args.sides in ("both", "lerobot"):
            command = [
                args.lerobot_python, __file__, "--side", "lerobot", "--variant", args.variant,
                "--steps", str(args.steps), "--log-every", str(args.log_every),
                "--val-every", str(args.val_every), "--fixtures", str(fixtures),
                "--threads", str(args.threads), "--inputs", str(inputs), "--out", str(out),
                "--lr", str(recipe["lr"]), "--eps", str(recipe["eps"]),
                "--weight-decay", str(recipe["weight_decay"]), "--grad-clip", str(recipe["grad_clip"]),
                "--warmup", str(recipe["warmup"]), "--seed", str(recipe["seed"]),
                "--betas", *map(str, recipe["betas"]), "--dims", json.dumps(dims),
                "--muon", json.dumps(recipe["muon"]) if "muon" in recipe else "",
            ]  # fmt: skip
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
            child = subprocess.Popen(command, stdout=sys.stderr, env=env)  # beside ours
        if args.sides in ("both", "ours"):
            result["ours"] = our_side(cfg, view, data, args)
        if child is not None:
            if child.wait() != 0:
                raise SystemExit(f"LeRobot's side exited {child.returncode}")
            result["lerobot"] = json.loads(out.read_text())
            result["inputs_max_abs_diff"] = compare_inputs(
                cfg, view, data, Path(f"{out}.inputs.npz")
            )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
