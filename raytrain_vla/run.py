"""`python -m raytrain_vla.run [--config CFG.yaml] [--dotted.key=value ...]`: train, validate, export.

Locally it starts an embedded Ray cluster; under `ray job submit` it joins the job's cluster.
Re-running the same `ray.run_name` resumes from that run's latest checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from raytrain_vla.config import Config, ConfigError, absolute_paths, parse_cli, to_dict
from raytrain_vla.data.source import ensure_dataset, root_fingerprint
from raytrain_vla.models.pretrained import weights_file
from raytrain_vla.train.resume import check_resume, fresh_run_name
from raytrain_vla.train.worker import run_dir_of, train_loop_per_worker

try:  # Ray Train's console level arrived late in 2.x; without it its INFO lines stay
    from ray.train import LoggingConfig as TrainLoggingConfig
except ImportError:
    TrainLoggingConfig = None


def init_ray(cfg: Config, max_concurrent_trials: int = 1) -> None:
    """Join the given (or the job's) cluster, else start a local one with CPUs for Ray Data too."""
    if ray.is_initialized():
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return
    workers = (
        cfg.ray.num_workers if isinstance(cfg.ray.num_workers, int) else cfg.ray.num_workers[1]
    )
    per_worker = int(cfg.ray.resources_per_worker.get("CPU", 1))
    num_cpus = cfg.ray.local_num_cpus or workers * per_worker * max_concurrent_trials + 4
    # The dashboard also serves the State API; without it Ray Train's placement-group cleaner
    # logs a warning every few seconds. None starts it whole with `ray[default]` installed and
    # without the optional modules otherwise (a minimal Ray, like the GPU check's), where True
    # would refuse to start the cluster.
    ray.init(num_cpus=num_cpus, include_dashboard=None, log_to_driver=True)


def build_trainer(cfg: Config, callbacks: list | None = None) -> TorchTrainer:
    storage = str(Path(cfg.ray.storage_path).expanduser().resolve())
    resources = dict(cfg.ray.resources_per_worker)
    quiet = {}
    if TrainLoggingConfig is not None:
        quiet["logging_config"] = TrainLoggingConfig(log_level=cfg.logging.ray_train_log_level)
    if cfg.ray.use_gpu:
        resources.setdefault("GPU", 1.0)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=to_dict(cfg),
        torch_config=TorchConfig(backend="nccl" if cfg.ray.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=tuple(cfg.ray.num_workers)
            if not isinstance(cfg.ray.num_workers, int)
            else cfg.ray.num_workers,
            use_gpu=cfg.ray.use_gpu,
            resources_per_worker=resources,
            elastic_resize_monitor_interval_s=cfg.ray.elastic_resize_monitor_interval_s,
        ),
        run_config=RunConfig(
            name=cfg.ray.run_name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.ray.num_to_keep),
            callbacks=callbacks or [],
            **quiet,
        ),
    )


def prepare_run(cfg: Config) -> None:
    """Pick the run name and refuse a resume whose recipe or dataset changed; writes nothing."""
    storage = Path(cfg.ray.storage_path)
    if cfg.model.init_from:
        weights_file(cfg.model.init_from)  # a wrong path fails here, not in every worker
    if cfg.ray.resume == "never":
        cfg.ray.run_name = fresh_run_name(storage, cfg.ray.run_name)
        return
    check_resume(cfg, storage / cfg.ray.run_name, root_fingerprint(cfg.data.root))


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
    scores = _last_eval_record(run_dir)
    if scores:  # the closed-loop evaluation at the end of the run (eval.episodes)
        summary["closed_loop_success"] = {
            k.removesuffix("_success_rate"): v for k, v in scores.items() if "success" in k
        }
    return summary


def _last_eval_record(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return next((r for r in reversed(records) if r["kind"] == "eval"), {})


def _last_line(err: BaseException) -> str:
    """The most specific line of a (possibly remote) traceback."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = absolute_paths(parse_cli(sys.argv[1:] if argv is None else argv))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        ensure_dataset(cfg.data)
        prepare_run(cfg)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
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
