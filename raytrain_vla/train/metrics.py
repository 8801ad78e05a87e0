"""Rank-0 metric sinks: a console line, `metrics.jsonl` in the run directory, and wandb.

wandb runs offline unless configured; a missing or broken wandb never stops training. The wandb
run id is fixed per run (name plus recipe hash), so a resumed run continues the same wandb run.
With the run directory in object storage, `metrics.jsonl` is rewritten whole (`JsonlLog`),
rollouts are uploaded, and wandb keeps its files in a local directory.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from raytrain_vla.common.run_storage import (
    JsonlLog,
    RunPath,
    is_remote,
    local_scratch,
    upload_directory,
)
from raytrain_vla.config.schema import LoggingConfig
from raytrain_vla.sim.closed_loop import EvalResult, frame_strip
from raytrain_vla.sim.metaworld_eval import Episode

log = logging.getLogger(__name__)


FLUSH_EVERY_S = 10.0  # object storage: how often metrics.jsonl is rewritten at most


def _local_dir(run_dir: RunPath, name: str) -> Path:
    """`run_dir/name` when it is local; for a run in object storage a local stand-in (its
    files are uploaded where they belong in the run)."""
    if not is_remote(run_dir):
        return Path(run_dir) / name
    return local_scratch(run_dir) / name


def _wandb_dir(run_dir: RunPath) -> Path:
    """wandb keeps its files in a local directory: the run's, or a stand-in for a URI."""
    if not is_remote(run_dir):
        return Path(run_dir)
    local = _local_dir(run_dir, "wandb")
    local.mkdir(parents=True, exist_ok=True)
    return local


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class MetricsLogger:
    def __init__(
        self,
        run_dir: RunPath,
        cfg: LoggingConfig,
        config_dict: dict,
        total_steps: int,
        run_id: str,
        start_step: int = 0,
    ):
        self.path = run_dir / "metrics.jsonl"
        if not is_remote(run_dir):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.jsonl = JsonlLog(self.path, flush_every_s=FLUSH_EVERY_S)
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
                    dir=str(_wandb_dir(run_dir)),
                    id=run_id,
                    resume="allow",
                    config=config_dict,
                    settings=wandb.Settings(silent=True, console="off"),
                )
            except Exception as err:  # noqa: BLE001 - tracking must never kill training
                log.warning("wandb disabled: %s", err)

    def log(self, step: int, metrics: dict, kind: str = "train") -> None:
        self.jsonl.write({"kind": kind, "step": step, "time": time.time(), **metrics})
        if self.wandb is not None:
            self.wandb.log({f"{kind}/{k}": v for k, v in metrics.items()}, step=step)
        if self.console:
            # Ray Train routes worker prints through the root logger *and* tees them to stdout,
            # which shows every line twice; one logger call shows it once.
            log.info(self._line(step, metrics, kind))

    def log_eval(self, step: int, results: list[EvalResult]) -> None:
        """Success and final distance per controller, and every recorded rollout as a PNG strip,
        an mp4 (in RUN/rollouts/) and a row of a wandb table."""
        metrics = {}
        for r in results:
            metrics[f"{r.name}_success_rate"] = r.success_rate
            metrics[f"{r.name}_final_distance"] = r.mean_final_distance
        self.log(step, metrics, kind="eval")
        rollouts = [(r.name, ro) for r in results for ro in r.rollouts]
        if not rollouts:
            return
        from PIL import Image

        from raytrain_vla.data.formats.video import encode_video
        from raytrain_vla.sim.simulator import FPS

        out = _local_dir(self.path.parent, "rollouts")
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        for i, (name, ro) in enumerate(rollouts):
            stem = out / f"step{step:06d}_{name}_{i}"
            # 4x nearest-neighbour upscale: 32 px frames are unreadable at their own size.
            big = np.repeat(np.repeat(ro.frames, 4, axis=1), 4, axis=2)
            strip = frame_strip(big)
            Image.fromarray(strip).save(stem.with_suffix(".png"))
            encode_video(stem.with_suffix(".mp4"), big, FPS)
            rows.append((i, name, ro.instruction, ro.success, ro.final_distance, strip, stem))
        if is_remote(self.path.parent):
            upload_directory(out, self.path.parent / "rollouts", replace=False)
        if self.wandb is None:
            return
        try:
            import wandb

            columns = ["episode", "controller", "instruction", "success", "final_distance"]
            table = wandb.Table(columns=[*columns, "frames", "video"])
            for i, name, instruction, success, distance, strip, stem in rows:
                table.add_data(
                    i, name, instruction, success, distance, wandb.Image(strip),
                    wandb.Video(str(stem.with_suffix(".mp4")), format="mp4"),
                )  # fmt: skip
            self.wandb.log({"eval/rollouts": table}, step=step)
        except Exception as err:  # noqa: BLE001 - tracking must never kill training
            log.warning("wandb rollouts not logged: %s", err)

    def log_metaworld_eval(self, step: int, metrics: dict[str, float], recorded: list) -> None:
        """Meta-World success (per controller, group and task), and the policy's recorded
        episodes as mp4s in RUN/rollouts/ and a wandb table."""
        self.log(step, metrics, kind="eval")
        if not recorded:
            return
        out = _local_dir(self.path.parent, "rollouts")
        paths = write_rollouts(out, recorded, prefix=f"step{step:06d}_metaworld_")
        if is_remote(self.path.parent):
            upload_directory(out, self.path.parent / "rollouts", replace=False)
        if self.wandb is None:
            return
        try:
            import wandb

            table = wandb.Table(columns=["task", "episode", "success", "steps", "video"])
            for e, path in zip(recorded, paths, strict=True):
                video = wandb.Video(str(path), format="mp4")
                table.add_data(e.task, e.episode, e.success, e.steps, video)
            self.wandb.log({"eval/rollouts": table}, step=step)
        except Exception as err:  # noqa: BLE001 - tracking must never kill training
            log.warning("wandb rollouts not logged: %s", err)

    def _line(self, step: int, metrics: dict, kind: str) -> str:
        if kind != "train":
            body = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
            return f"[{kind}] step {step}/{self.total_steps} {body}"
        done = step - self.start_step
        elapsed = time.monotonic() - self.start
        eta = elapsed / done * (self.total_steps - step) if done > 0 else float("nan")
        lr = next((v for k, v in metrics.items() if k.startswith("lr/")), float("nan"))
        return (
            f"step {step}/{self.total_steps} loss={metrics['loss']:.4f} lr={lr:.3g} "
            f"grad_norm={metrics['grad_norm']:.3g} samples/s={metrics['samples_per_s']:.1f} "
            f"data_wait={100 * metrics['data_wait_share']:.1f}% eta={eta:.0f}s"
        )

    def flush(self) -> None:
        """Make every record so far durable (before a checkpoint is reported)."""
        self.jsonl.flush()

    def close(self) -> None:
        self.jsonl.close()
        if self.wandb is not None:
            self.wandb.finish()


def write_rollouts(out: Path, recorded: list[Episode], prefix: str = "") -> list[Path]:
    """Each recorded episode as an mp4 at LeRobot's 80 fps:
    `{prefix}{task}_ep{k}_{success|failure}.mp4`."""
    from raytrain_vla.data.formats.video import encode_video
    from raytrain_vla.sim.metaworld_env import FPS

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for e in recorded:
        outcome = "success" if e.success else "failure"
        path = out / f"{prefix}{e.task}_ep{e.episode}_{outcome}.mp4"
        encode_video(path, e.frames, FPS)
        paths.append(path)
    return paths
