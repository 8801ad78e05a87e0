"""A real sweep: 2 ASHA trials of 2 FSDP2 workers each, a driver killed mid-sweep and re-run.

One sweep covers the acceptance points together: the sweep driver is SIGKILLed after the
first trial finished and re-run under the same name (that trial is not run again), the
restarted driver's ASHA stops the second trial on the rung the first one set before the
restart, the table and `best_config.yaml` are written, `best_config.yaml` trains through
`run` unedited, and every trial's optimizer used the sampled per-group LRs.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runs import short_run_args

from raytrain_vla import run
from raytrain_vla import tune as tune_cli
from raytrain_vla.tuning.sweep import trial_run_name

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 30
GROUPS = ("vision", "backbone", "action_expert")
# Trials run one at a time in grid order. The driver is restarted after the first (a good LR)
# finished; only its recorded results, replayed into the new driver's ASHA, can stop the
# second (a near-zero action-expert LR) at the step-10 or step-20 rung.
SPACE = f"""
metric: val_action_mse
mode: min
num_samples: 1
max_concurrent_trials: 1
fixed:
  train.steps: {STEPS}
  train.val_interval: 10
  train.save_interval: 10
  scheduler.type: constant
  scheduler.warmup_steps: 0
scheduler: {{type: asha, grace_period: 10, reduction_factor: 2}}
search: {{algorithm: random, seed: 0}}
params:
  optimizer.groups.action_expert.lr: {{grid: [3.0e-3, 1.0e-8]}}
  optimizer.groups.vision.lr: {{loguniform: [1.0e-4, 1.0e-3]}}
  optimizer.groups.backbone.lr: {{loguniform: [1.0e-4, 1.0e-3]}}
"""


def trial_states(sweep_dir: Path) -> dict[str, str]:
    """Trial id -> status from Tune's saved experiment state (what a restore starts from)."""
    states = sorted(sweep_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return {}
    try:
        data = json.loads(states[-1].read_text())
    except json.JSONDecodeError:
        return {}  # caught mid-write
    trials = [json.loads(trial_json) for trial_json, _runtime_json in data["trial_data"]]
    return {t["trial_id"]: t["status"] for t in trials}


def snapshot(directory: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in directory.rglob("*")}


def last_train_row(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"][-1]


def test_asha_sweep_survives_a_driver_restart_and_hands_back_a_trainable_config(
    ray_cluster, demo_root, tmp_path
):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    storage = tmp_path / "sweeps"
    # The space fixes the budget and intervals; a command-line value would replace them.
    fixed = ("--train.steps", "--train.val_interval", "--train.save_interval", "--scheduler.")
    base = [
        a for a in short_run_args(demo_root, storage, "unused", STEPS) if not a.startswith(fixed)
    ]
    args = ["--space", str(space), "--name", "asha", *base]
    sweep_dir = storage / "asha"

    # 1. Start the sweep in its own driver process and SIGKILL it once Tune has recorded the
    #    first trial as finished.
    # Tune saves its experiment state at most every 10 s by default; each second saved here is
    # one the second trial does not run in a driver about to be killed.
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address, "TUNE_GLOBAL_CHECKPOINT_S": "1"}
    log = (tmp_path / "driver.log").open("w")
    cmd = [sys.executable, "-m", "raytrain_vla.tune", *args]
    driver = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    try:
        while "TERMINATED" not in trial_states(sweep_dir).values():
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no trial finished within 300 s"
            time.sleep(1)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finished = [t for t, s in trial_states(sweep_dir).items() if s == "TERMINATED"]
    first_run = sweep_dir / "trials" / trial_run_name(finished[0])
    before = snapshot(first_run)
    assert (first_run / "export" / "model.safetensors").is_file()

    # 2. Re-run under the same name: the sweep continues and the finished trial is not re-run.
    assert tune_cli.main(args) == 0
    assert snapshot(first_run) == before

    with (sweep_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    second = next(r for r in rows if r["trial_id"] != finished[0])
    assert second["stopped_early"] == "True", rows
    assert [float(r["val_action_mse"]) for r in rows] == sorted(
        float(r["val_action_mse"]) for r in rows
    )
    # 3. The optimizer param groups inside the workers ran at the sampled per-group LRs.
    for row in rows:
        logged = last_train_row(sweep_dir / "trials" / trial_run_name(row["trial_id"]))
        for group in GROUPS:
            assert logged[f"lr/{group}"] == float(row[f"optimizer.groups.{group}.lr"]), group

    # 4. The best config trains as it is, and the best trial's policy was kept. Two steps show
    #    the sampled LRs in the workers; the other 28 would only cost suite time.
    assert (sweep_dir / "best_policy" / "model.safetensors").is_file()
    best = json.loads((sweep_dir / "best_trial.json").read_text())
    assert best["trial_id"] == rows[0]["trial_id"]
    assert run.main(["--config", str(sweep_dir / "best_config.yaml"), "--train.steps=2"]) == 0
    best_run = storage / "asha-best"
    assert last_train_row(best_run)["lr/action_expert"] == float(
        rows[0]["optimizer.groups.action_expert.lr"]
    )
