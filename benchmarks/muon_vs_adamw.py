"""Muon against AdamW on the demo task, each at its best LR from a small sweep. Prints JSON.

Every run is `python -m raytrain_vla.run` on the demo dataset (2 CPU workers, constant LR after
the default warm-up, the same LR for every group), validating every `--val-interval` steps:
1. sweep: seed 0 at each LR of `--adamw-lrs` / `--muon-lrs`; an optimizer's best LR reaches
   `--target` val_mse_ratio in the fewest steps (the lowest final ratio if none reaches it);
2. seeds: the best LR of each at every seed of `--seeds` (seed 0's sweep run is reused);
   `steps_to_target` per seed (null: not within `--steps`);
3. step time: the median `step_time_s` of the logged steps after the first 20% of the best runs,
   as Muon over AdamW; with `--smolvla-fixture DIR`, also a short run of each on SmolVLA at the
   fixture's size (smolvla_learning_check.sh's model: every part training, 32 px inputs).

    python benchmarks/muon_vs_adamw.py --size small --steps 3000 --seeds 0,1,2
    python benchmarks/muon_vs_adamw.py --size tiny --steps 600 --seeds 0 \\
        --adamw-lrs 1e-3,3e-3 --muon-lrs 1e-3,3e-3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(storage: Path, name: str, args: list[str]) -> list[dict]:
    """One training run; its metrics.jsonl records."""
    cmd = [
        sys.executable, "-m", "raytrain_vla.run", f"--ray.storage_path={storage}",
        f"--ray.run_name={name}", "--ray.resume=never", "--logging.wandb_mode=disabled",
        "--logging.console=false", "--eval.episodes=0", *args,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    lines = (storage / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def steps_to(records: list[dict], target: float) -> int | None:
    for r in records:
        if r["kind"] == "val" and r["val_mse_ratio"] <= target:
            return int(r["step"])
    return None


def final_ratio(records: list[dict]) -> float:
    return [r["val_mse_ratio"] for r in records if r["kind"] == "val"][-1]


def step_time(records: list[dict]) -> float:
    times = [r["step_time_s"] for r in records if r["kind"] == "train" and "step_time_s" in r]
    return statistics.median(times[len(times) // 5 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="flow_vla size: tiny, small, base")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--val-interval", type=int, default=100)
    parser.add_argument("--target", type=float, default=0.05, help="val_mse_ratio to reach")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--adamw-lrs", default="3e-4,1e-3,3e-3")
    parser.add_argument("--muon-lrs", default="3e-4,1e-3,3e-3")
    parser.add_argument("--smolvla-fixture", default=None, help="lerobot_smolvla_tiny: step time")
    parser.add_argument("--smolvla-steps", type=int, default=20)
    parser.add_argument("--storage", default=None, help="where runs go (default: a temp dir)")
    parser.add_argument("--no-sweep", action="store_true", help="only the SmolVLA step time")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.no_sweep and not args.smolvla_fixture:
        raise SystemExit("--no-sweep leaves only the SmolVLA part: give --smolvla-fixture")
    if 0 not in seeds or args.steps < args.val_interval or args.val_interval < 1:
        raise SystemExit(
            "--seeds must include 0 (the sweep's seed); --steps >= --val-interval >= 1"
        )
    lrs = {"adamw": args.adamw_lrs, "muon": args.muon_lrs}
    common = [
        f"--model.flow_vla.size={args.size}", f"--train.steps={args.steps}",
        f"--train.val_interval={args.val_interval}", f"--train.save_interval={args.steps}",
        "--scheduler.type=constant", "--optimizer.groups=[]", "--train.log_interval=10",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        storage = Path(args.storage or tmp)
        result: dict = (
            {} if args.no_sweep else {"size": args.size, "steps": args.steps, "target": args.target}
        )  # the sweep's settings, printed only when it runs
        for opt, text in {} if args.no_sweep else lrs.items():
            sweep, records = {}, {}
            for lr in (float(x) for x in text.split(",")):
                name = f"{opt}_lr{lr:g}_seed0"
                records[lr] = run(storage, name, [*common, f"--optimizer.type={opt}",
                                                  f"--optimizer.lr={lr}", "--train.seed=0"])  # fmt: skip
                sweep[lr] = {"steps_to_target": steps_to(records[lr], args.target),
                             "final_val_mse_ratio": final_ratio(records[lr])}  # fmt: skip
            best = min(
                sweep,
                key=lambda lr: (
                    sweep[lr]["steps_to_target"] or 10**9,
                    sweep[lr]["final_val_mse_ratio"],
                ),
            )
            per_seed = {0: sweep[best]}
            times = [step_time(records[best])]
            for seed in (s for s in seeds if s != 0):
                rec = run(storage, f"{opt}_lr{best:g}_seed{seed}", [*common, f"--optimizer.type={opt}",
                          f"--optimizer.lr={best}", f"--train.seed={seed}"])  # fmt: skip
                per_seed[seed] = {"steps_to_target": steps_to(rec, args.target),
                                  "final_val_mse_ratio": final_ratio(rec)}  # fmt: skip
                times.append(step_time(rec))
            result[opt] = {"sweep": sweep, "best_lr": best, "per_seed": per_seed,
                           "step_time_s": statistics.median(times)}  # fmt: skip
        if not args.no_sweep:
            result["muon_over_adamw_step_time"] = (
                result["muon"]["step_time_s"] / result["adamw"]["step_time_s"]
            )
        if args.smolvla_fixture:
            fx = Path(args.smolvla_fixture)
            smol = [
                "--model.type=smolvla", f"--model.smolvla.vlm_path={fx / 'vlm'}",
                f"--train.steps={args.smolvla_steps}", "--train.val_interval=100000",
                f"--train.save_interval={args.smolvla_steps}", "--train.log_interval=1",
                "--model.smolvla.num_vlm_layers=4", "--model.smolvla.resize_imgs_with_padding=[32,32]",
                "--model.smolvla.train_expert_only=false",
                "--model.smolvla.freeze_vision_encoder=false", "--data.chunk_size=10",
            ]  # fmt: skip
            smol_times = {
                opt: step_time(run(storage, f"smolvla_{opt}", [*smol, f"--optimizer.type={opt}"]))
                for opt in ("adamw", "muon")
            }
            result["smolvla_fixture_step_time_s"] = smol_times
            result["smolvla_muon_over_adamw_step_time"] = smol_times["muon"] / smol_times["adamw"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
