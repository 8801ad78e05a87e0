"""`python -m raytrain_vla.run [--config CFG.yaml] [--dotted.key=value ...]`: train, validate, export.

Locally it starts an embedded Ray cluster; under `ray job submit` it joins the job's cluster.
Re-running the same `ray.run_name` resumes from that run's latest checkpoint.
"""

from __future__ import annotations

import json
import sys
import time

from raytrain_vla.cli import fail
from raytrain_vla.common.run_storage import RunPath
from raytrain_vla.config import Config, ConfigError, absolute_paths, dataset_configs, parse_cli
from raytrain_vla.config.help import format_config_help, wants_help
from raytrain_vla.data.demo import ensure_dataset
from raytrain_vla.data.mixture import data_fingerprint
from raytrain_vla.models.checks import check_model_options
from raytrain_vla.train.driver_lock import driver_lock
from raytrain_vla.train.init_source import weights_file
from raytrain_vla.train.launch import build_trainer, init_ray
from raytrain_vla.train.preflight import check_before_ray
from raytrain_vla.train.resume import check_resume, fresh_run_name
from raytrain_vla.train.trainer import run_dir_of

__all__ = ["build_trainer", "init_ray", "main", "claim_run_name", "prepare_run", "summarize"]


def claim_run_name(cfg: Config) -> None:
    """With `ray.resume=never`, a fresh run name whose directory this driver created."""
    if cfg.model.init_from:
        weights_file(cfg.model.init_from)  # a wrong path fails here, not in every worker
    if cfg.ray.resume == "never":
        cfg.ray.run_name = fresh_run_name(cfg.ray.storage_path, cfg.ray.run_name)


def prepare_run(cfg: Config) -> None:
    """Refuse a resume whose recipe or dataset changed (call holding the run's driver lock)."""
    if cfg.ray.resume != "never":
        check_resume(cfg, run_dir_of(cfg), data_fingerprint(cfg.data))


def summarize(cfg: Config, metrics: dict, seconds: float) -> dict:
    run_dir = run_dir_of(cfg)
    summary = {
        "run_dir": str(run_dir),
        "steps": metrics.get("step"),
        "samples_per_s": metrics.get("samples_per_s"),
        "val_action_mse": metrics.get("val_action_mse"),
        "val_mean_action_mse": metrics.get("val_mean_action_mse"),
        "val_mse_ratio": metrics.get("val_mse_ratio"),
        "export": str(run_dir / "export"),
        "wall_s": round(seconds, 1),
    }
    if cfg.data.mixture:  # each robot against its own mean action, from the last validation
        last_val = _last_record(run_dir, "val")
        summary["val_mse_ratio_per_dataset"] = {
            e.name: last_val.get(f"val_mse_ratio/{e.name}") for e in cfg.data.mixture
        }
    scores = _last_record(run_dir, "eval")
    if scores:  # the closed-loop evaluation at the end of the run (eval.episodes)
        summary["closed_loop_success"] = {  # overall, and Meta-World's groups (not tasks)
            k.replace("_success_rate", ""): v
            for k, v in scores.items()
            if "success" in k and not k.endswith("-v3")
        }
    return summary


def _last_record(run_dir: RunPath, kind: str) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return next((r for r in reversed(records) if r["kind"] == kind), {})


def _last_line(err: BaseException) -> str:
    """The most specific line of a (possibly remote) traceback."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


USAGE = "python -m raytrain_vla.run [--config CFG.yaml] [--KEY=VALUE ...]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(format_config_help(USAGE, __doc__ or "", []), end="")
        return 0
    try:
        cfg = absolute_paths(parse_cli(argv))
        check_model_options(cfg.model, cfg.optimizer)
    except ConfigError as err:
        return fail(err, 2)
    start = time.monotonic()
    try:
        for one in dataset_configs(cfg.data):
            ensure_dataset(one)
        check_before_ray(cfg)
        claim_run_name(cfg)
        with driver_lock(run_dir_of(cfg), "training driver"):
            return _train(cfg, start)
    except ConfigError as err:
        return fail(err, 2)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        return fail(err, 1)


def _train(cfg: Config, start: float) -> int:
    prepare_run(cfg)
    init_ray(cfg)
    try:
        result = build_trainer(cfg).fit()
    except Exception as err:  # noqa: BLE001 - the CLI reports any failure in one line
        print(f"error: training failed: {_last_line(err)}", file=sys.stderr)
        return 1
    summary = summarize(cfg, result.metrics or {}, time.monotonic() - start)
    print("summary: " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
