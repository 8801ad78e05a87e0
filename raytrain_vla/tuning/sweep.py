"""Run a sweep: one Tune trial per config, each a full TorchTrainer run with FSDP2 workers.

Train V2 pattern: a function trainable launches the trainer and a Train callback forwards each
validation report to Tune, where ASHA or the median rule can stop the trial. Re-running the
same sweep name restores the Tune experiment: finished trials are not run again, and the
scheduler is given back what it had seen (`tuning/schedulers.py`).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.search import BasicVariantGenerator

from raytrain_vla.common.run_storage import (
    RunPath,
    is_remote,
    local_directory,
    upload_directory,
)
from raytrain_vla.config import Config, to_dict, to_yaml
from raytrain_vla.train.launch import build_trainer
from raytrain_vla.tuning.schedulers import build_scheduler
from raytrain_vla.tuning.space import Space, SpaceError, trial_config

SWEEP_RECORD = "sweep.yaml"  # the space and base config a sweep was started with


class ValidationReports(TuneReportCallback):
    """Forward only the reports that carry the sweep metric, so Tune sees one row per validation.

    Checkpoint-only reports would otherwise fail Tune's strict metric check.
    """

    def __init__(self, metric: str) -> None:
        super().__init__()
        self._metric = metric

    def after_report(self, run_context, metrics, checkpoint) -> None:
        if metrics and self._metric in metrics[0]:
            super().after_report(run_context, metrics, checkpoint)


def _domain(param) -> Any:
    a = param.args
    return {
        "loguniform": lambda: tune.loguniform(a[0], a[1]),
        "uniform": lambda: tune.uniform(a[0], a[1]),
        "quniform": lambda: tune.quniform(a[0], a[1], a[2]),
        "randint": lambda: tune.randint(a[0], a[1]),
        "choice": lambda: tune.choice(list(a)),
        "grid": lambda: tune.grid_search(list(a)),
    }[param.domain]()


def param_space(space: Space) -> dict:
    return {p.key: _domain(p) for p in space.params}


def _search(space: Space):
    if space.algorithm == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(seed=space.seed)
        except (ImportError, AssertionError) as err:
            raise SpaceError(
                f"{space.path}: search.algorithm 'optuna' needs `pip install 'raytrain_vla[optuna]'` ({err})"
            ) from err
    return BasicVariantGenerator(
        random_state=space.seed, max_concurrent=space.max_concurrent_trials
    )


def trial_run_name(trial_id: str) -> str:
    return f"trial_{trial_id}"


def run_trial(sampled: dict, space: Space, base: Config, trials_dir: str) -> None:
    """Tune's function trainable: build the trial's config and run it to the end (or a stop)."""

    cfg, _ = trial_config(space, base, sampled)
    cfg.ray.storage_path = trials_dir
    cfg.ray.run_name = trial_run_name(tune.get_context().get_trial_id())
    build_trainer(cfg, callbacks=[ValidationReports(space.metric)]).fit()


def record_sweep(sweep_dir: RunPath, space: Space, base: Config) -> None:
    """Write what the sweep was started with, or refuse a re-run that changed it."""
    record = {"space": yaml.safe_load(space.path.read_text()), "base_config": to_dict(base)}
    for key in ("ray", "logging"):
        record["base_config"].pop(key)  # where and how it runs may change on a re-run
    path = sweep_dir / SWEEP_RECORD
    if path.is_file():
        old = yaml.safe_load(path.read_text())
        if old != record:
            changed = sorted(k for k in record if old.get(k) != record[k])
            raise SpaceError(
                f"{path}: sweep '{sweep_dir.name}' was started with a different "
                f"{' and '.join(changed)}; use another --name"
            )
        return
    if not is_remote(sweep_dir):
        sweep_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(record, sort_keys=False))


def build_tuner(space: Space, base: Config, sweep_dir: RunPath) -> tune.Tuner:
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial, space=space, base=base, trials_dir=str(sweep_dir / "trials")
        ),
        {"CPU": 0.01},  # the trial driver only waits; its TorchTrainer holds the real resources
    )
    if tune.Tuner.can_restore(str(sweep_dir)):
        return tune.Tuner.restore(
            str(sweep_dir),
            trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=param_space(space),
        )
    cfg, _ = trial_config(space, base, {})
    return tune.Tuner(
        trainable,
        param_space=param_space(space),
        tune_config=tune.TuneConfig(
            metric=space.metric,
            mode=space.mode,
            num_samples=space.num_samples,
            max_concurrent_trials=space.max_concurrent_trials,
            scheduler=build_scheduler(space, cfg),
            search_alg=_search(space),
        ),
        run_config=tune.RunConfig(name=sweep_dir.name, storage_path=str(sweep_dir.parent)),
    )


def results_table(result_grid, space: Space, base: Config) -> list[dict]:
    """One row per trial, best first: sampled values, final metric, steps, early stop."""
    cfg, _ = trial_config(space, base, {})
    rows = []
    for result in result_grid:
        sampled = {p.key: result.config.get(p.key) for p in space.params}
        _, applied = trial_config(space, base, sampled)
        metrics = result.metrics or {}
        steps = metrics.get("step", 0)
        rows.append(
            {
                "trial_id": metrics.get("trial_id") or Path(result.path).name,
                **{k: applied.get(k, "") for k in sampled},
                space.metric: metrics.get(space.metric, float("nan")),
                "steps": steps,
                "stopped_early": result.error is None and steps < cfg.train.steps,
                "error": type(result.error).__name__ if result.error else "",
            }
        )
    sign = 1 if space.mode == "min" else -1
    rows.sort(key=lambda r: (r[space.metric] != r[space.metric], sign * r[space.metric]))
    return rows


def write_results(rows: list[dict], sweep_dir: RunPath) -> RunPath:
    path = sweep_dir / "results.csv"
    text = io.StringIO()  # one write: an object store has no append
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(text.getvalue())
    return path


def format_table(rows: list[dict]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cols = list(rows[0])
    widths = [max(len(c), *(len(cell(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += [
        "  ".join(cell(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)) for r in rows
    ]
    return "\n".join(lines)


def best_row(rows: list[dict], space: Space) -> dict | None:
    """The best trial that finished (or was stopped early) without error and has the metric;
    None when none did: an errored trial's last report is not a result to recommend."""
    finished = [r for r in rows if not r["error"] and r[space.metric] == r[space.metric]]
    return finished[0] if finished else None  # rows are sorted best first


def write_best(best: dict, space: Space, base: Config, sweep_dir: RunPath) -> tuple[RunPath, dict]:
    """`best_config.yaml` (trainable with `run --config`) and a copy of the best trial's policy."""
    sampled = {p.key: best[p.key] for p in space.params if best[p.key] != ""}
    cfg, _ = trial_config(space, base, sampled)
    cfg.ray.run_name = f"{sweep_dir.name}-best"
    cfg.ray.resume = "never"  # a second `run` of this file starts fresh instead of refusing
    path = sweep_dir / "best_config.yaml"
    header = f"# Best trial {best['trial_id']} of sweep '{sweep_dir.name}' ({space.metric}={best[space.metric]})\n"
    path.write_text(header + to_yaml(cfg))
    trial_dir = sweep_dir / "trials" / trial_run_name(best["trial_id"])
    info = {"trial_id": best["trial_id"], "run_dir": str(trial_dir), "export": None}
    if (trial_dir / "export" / "model.safetensors").is_file():
        _copy_policy(trial_dir / "export", sweep_dir / "best_policy")
        info["export"] = str(sweep_dir / "best_policy")
    (sweep_dir / "best_trial.json").write_text(json.dumps(info, indent=2))
    return path, info


def _copy_policy(src: RunPath, dst: RunPath) -> None:
    if not is_remote(dst):
        shutil.copytree(src, dst, dirs_exist_ok=True)
        return
    with local_directory(src) as local:
        upload_directory(local, dst)
