"""Ray at the launcher's edge: join or start the cluster, and the TorchTrainer for a config.

Used by `run` and by every Tune trial (`tuning/sweep.py`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig

from raytrain_vla.common.run_storage import run_path
from raytrain_vla.config import Config, ConfigError, to_dict
from raytrain_vla.train.failure_policy import Trainer
from raytrain_vla.train.worker import train_loop_per_worker

try:  # Ray Train's console level arrived late in 2.x; without it its INFO lines stay
    from ray.train import LoggingConfig as TrainLoggingConfig
except ImportError:
    TrainLoggingConfig = None


def init_ray(cfg: Config, max_concurrent_trials: int = 1) -> None:
    """Join the given (or the job's) cluster; else join a cluster `ray start` runs on this node
    (as a bare `ray.init()` would), saying so; else start a private one with CPUs for Ray Data
    too. `ray.local_num_cpus`, when given, always gets a private cluster of that size."""
    if ray.is_initialized():
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address and cfg.ray.local_num_cpus:
        raise ConfigError(
            f"'ray.local_num_cpus' ({cfg.ray.local_num_cpus}) sizes a private local cluster, but "
            f"this driver joins {address} (ray.address or RAY_ADDRESS); give one of them"
        )
    if address:
        ray.init(address=address)
        return
    running, recorded = _cluster_started_here()
    if running and not cfg.ray.local_num_cpus:
        print(
            f"note: joining the Ray cluster `ray start` runs on this node ({running}); its "
            "resources are used as they are (set ray.local_num_cpus for a private cluster)",
            file=sys.stderr,
        )
        ray.init(address="auto")  # what a bare ray.init() does (and its auth token lookup)
        return
    if running or recorded:
        why = "ray.local_num_cpus is set" if running else f"the one at {recorded} is gone"
        print(f"note: starting a private Ray cluster ({why})", file=sys.stderr)
    workers = (
        cfg.ray.num_workers if isinstance(cfg.ray.num_workers, int) else cfg.ray.num_workers[1]
    )
    per_worker = int(cfg.ray.resources_per_worker.get("CPU", 1))
    num_cpus = cfg.ray.local_num_cpus or workers * per_worker * max_concurrent_trials + 4
    # The dashboard also serves the State API; without it Ray Train's placement-group cleaner
    # logs a warning every few seconds. None starts it whole with `ray[default]` installed and
    # without the optional modules otherwise (a minimal Ray, like the GPU check's), where True
    # would refuse to start the cluster. "local": Ray would otherwise connect to the cluster
    # its node file names, and refuse num_cpus for it.
    ray.init(
        address="local" if (running or recorded) else None,
        num_cpus=num_cpus,
        include_dashboard=None,
        log_to_driver=True,
    )


def _cluster_started_here() -> tuple[str | None, str | None]:
    """(address of a live cluster `ray start` recorded on this node, the recorded address).

    Ray's own lookup (private, hence guarded): `ray start` writes the address to a file in
    Ray's temp directory; a cluster stopped by a kill leaves the file behind."""
    try:
        from ray._private.services import find_bootstrap_address, find_gcs_addresses
    except ImportError:
        return None, None
    recorded = find_bootstrap_address(None)
    if recorded is None:
        return None, None
    return (recorded if recorded in find_gcs_addresses() else None), recorded


# torch's CPU allocator backs buffers of 2 MB and more with transparent huge pages when this is
# set in a process before its first allocation. FSDP2 allocates and frees its gather and
# reduce-scatter buffers every step; on CPU each fresh 4 KB page then faults and is cleared,
# which slowed the real-size FSDP2 step (benchmarks/README.md, "Frozen weights").
# Memory only: the results are bitwise the same.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def worker_env_vars(driver_env: Mapping[str, str]) -> dict[str, str]:
    """Environment of every training worker: huge pages on, unless the driver's environment
    already says otherwise (its value is passed on as it is)."""
    return {HUGE_PAGES_ENV: driver_env.get(HUGE_PAGES_ENV, "1")}


def build_trainer(cfg: Config, callbacks: list | None = None) -> Trainer:
    storage = str(run_path(cfg.ray.storage_path))  # a URI as is: Ray Train writes via pyarrow.fs
    resources = dict(cfg.ray.resources_per_worker)
    quiet = {}
    if TrainLoggingConfig is not None:
        quiet["logging_config"] = TrainLoggingConfig(log_level=cfg.logging.ray_train_log_level)
    if cfg.ray.use_gpu:
        resources.setdefault("GPU", 1.0)
    return Trainer(
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
            worker_runtime_env={"env_vars": worker_env_vars(os.environ)},
            **quiet,
        ),
    )
