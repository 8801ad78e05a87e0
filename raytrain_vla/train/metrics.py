"""Rank-0 metric sinks: a console line, `metrics.jsonl` in the run directory, and wandb.

wandb runs offline unless configured; a missing or broken wandb never stops training.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from raytrain_vla.config.schema import LoggingConfig

log = logging.getLogger(__name__)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        cfg: LoggingConfig,
        config_dict: dict,
        total_steps: int,
        run_id: str,
        start_step: int = 0,
    ):
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.console = cfg.console
        self.total_steps = total_steps
        self.start = time.monotonic()
        self.start_step = start_step
        self.wandb = None
        if cfg.wandb_mode != "disabled":
            try:
                import wandb

                self.wandb = wandb.init(
                    project=cfg.wandb_project,
                    mode=cfg.wandb_mode,
                    dir=str(run_dir),
                    id=run_id,
                    resume="allow",
                    config=config_dict,
                    settings=wandb.Settings(silent=True, console="off"),
                )
            except Exception as err:  # noqa: BLE001 - tracking must never kill training
                log.warning("wandb disabled: %s", err)

    def log(self, step: int, metrics: dict, kind: str = "train") -> None:
        record = {"kind": kind, "step": step, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({f"{kind}/{k}": v for k, v in metrics.items()}, step=step)
        if self.console:
            # Ray Train routes worker prints through the root logger *and* tees them to stdout,
            # which shows every line twice; one logger call shows it once.
            log.info(self._line(step, metrics, kind))

    def _line(self, step: int, metrics: dict, kind: str) -> str:
        if kind != "train":
            body = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
            return f"[val] step {step}/{self.total_steps} {body}"
        done = step - self.start_step
        elapsed = time.monotonic() - self.start
        eta = elapsed / done * (self.total_steps - step) if done > 0 else float("nan")
        lr = next((v for k, v in metrics.items() if k.startswith("lr/")), float("nan"))
        return (
            f"step {step}/{self.total_steps} loss={metrics['loss']:.4f} lr={lr:.3g} "
            f"grad_norm={metrics['grad_norm']:.3g} samples/s={metrics['samples_per_s']:.1f} "
            f"data_wait={100 * metrics['data_wait_share']:.1f}% eta={eta:.0f}s"
        )

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
