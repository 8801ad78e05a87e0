"""One rank's training run, split the way torchtitan's `Trainer` is: build, the step loop, the
interval hooks (log, validate, save) and the end of the run (export, closed-loop evaluation).

Build order follows torchtitan: meta model -> freeze -> shard -> fill from rank 0's init source
-> optimizer -> checkpoint load -> data from the cursor on. The model is reached only through
the family contract (`models/base.py`); Ray only through the `Session` the worker passes in.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import register_fsdp_forward_method

from raytrain_vla import policy as policy_lib
from raytrain_vla.common.metaworld_tasks import eval_tasks
from raytrain_vla.common.run_storage import (
    JsonlLog,
    RunPath,
    is_remote,
    local_directory,
    run_path,
)
from raytrain_vla.config import Config, check_batch_layout, recipe_hash, to_dict, to_yaml
from raytrain_vla.data.embodiment import EmbodimentActions
from raytrain_vla.data.mixture import MixtureView, open_view
from raytrain_vla.models.checks import check_roles
from raytrain_vla.models.registry import get_family
from raytrain_vla.policy.format import PolicyMeta, write_policy
from raytrain_vla.sim.closed_loop import evaluate, is_demo_dataset, render_size, run_episodes
from raytrain_vla.sim.metaworld_eval import (
    CONTROLLERS,
    Episode,
    PolicyFactory,
    evaluate_metaworld,
    policy_image_size,
)
from raytrain_vla.train import faults
from raytrain_vla.train.checkpoint import load_checkpoint, tensor_state, write_sidecars
from raytrain_vla.train.checkpoint_saver import (
    CheckpointSaver,
    check_staging_room,
    staging_bytes,
)
from raytrain_vla.train.checkpoint_scratch import (
    new_checkpoint_directory,
    remove_orphaned_checkpoints,
)
from raytrain_vla.train.comm import CommCounter
from raytrain_vla.train.flops import example_columns, peak_tflops, training_flops_per_sample
from raytrain_vla.train.frozen import frozen_bytes, place_frozen, rank_memory_bytes
from raytrain_vla.train.fsdp import apply_fsdp
from raytrain_vla.train.init_source import build_init_source
from raytrain_vla.train.inputs import train_stream, val_batches
from raytrain_vla.train.manifest import all_problems
from raytrain_vla.train.materialize import gather_full_state, materialize_from_rank0, meta_model
from raytrain_vla.train.mesh import build_mesh
from raytrain_vla.train.metrics import MetricsLogger
from raytrain_vla.train.noise import flow_noise_and_time
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    resolve_groups,
)
from raytrain_vla.train.resume import (
    CheckpointDamaged,
    prune_untracked_checkpoints,
    recipe_problems,
    resume_candidates,
)
from raytrain_vla.train.step import StepRunner
from raytrain_vla.train.throughput import ThroughputMeter
from raytrain_vla.train.train_state import (
    TrainState,
    check_frozen,
    frozen_checksum,
    read_train_state,
)
from raytrain_vla.train.validate import validate


class Session(Protocol):
    """What the trainer needs of Ray Train (`train/worker.py` implements it)."""

    rank: int
    world_size: int
    local_world_size: int  # ranks on this node: they share its host memory
    device: torch.device

    def latest_checkpoint(self) -> AbstractContextManager[Path | str | None]:
        """The checkpoint to resume from: a local directory, or (run storage in an object store)
        its path in that store, of which the trainer uses the name."""
        ...

    def report(
        self, metrics: dict, checkpoint_dir: Path | None = None, upload_in_background: bool = False
    ) -> None:
        """Register metrics (and a complete checkpoint, which the session may then delete)."""
        ...


def run_dir_of(cfg: Config) -> RunPath:
    """`ray.storage_path/run_name`: a local Path, or a UPath when storage is a URI."""
    return run_path(cfg.ray.storage_path) / cfg.ray.run_name


def _due(done: int, interval: int, total: int) -> bool:
    return done % interval == 0 or done == total


class Trainer:
    def __init__(self, cfg: Config, session: Session):
        self.cfg, self.session = cfg, session
        self.rank, self.world, self.device = session.rank, session.world_size, session.device
        self.accum = check_batch_layout(
            cfg.train.global_batch_size, cfg.train.micro_batch_size, self.world
        )
        self.view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
        self.mixture = self.view if isinstance(self.view, MixtureView) else None
        torch.manual_seed(cfg.train.seed)  # the same global RNG stream on every rank
        self.family = get_family(cfg.model.type)
        self.model_config = self.family.resolve_config(
            cfg.model.options, self.view.spec, cfg.model.init_from, cfg.model.lora
        )
        self.processor = self.family.processor(self.model_config, self.view.normalizer)
        self.policy_meta = PolicyMeta(
            self.family.name, self.model_config, self.view.spec, tuple(self.view.tasks),
            tuple(self.view.mean_action.tolist()),
            tuple(self.mixture.embodiments) if self.mixture else (),
            self.mixture.layout if self.mixture else None,
        )  # fmt: skip
        self.config_hash = recipe_hash(cfg)
        self.run_dir = run_dir_of(cfg)
        for orphan in remove_orphaned_checkpoints(self.run_dir):
            print(f"[raytrain_vla] removed {orphan}, a checkpoint a dead worker left unreported")
        self._build()
        if cfg.train.async_checkpoint:
            per_rank = staging_bytes(self.model, self.frozen)
            check_staging_room(per_rank, self.session.local_world_size)
        self.saver = CheckpointSaver(  # collective
            cfg.train.async_checkpoint, self.device, self.optimizer
        )
        self.start_step = self._restore()
        # Closed-loop scoring needs the demo task's data: the run's, or a mixture's demo member.
        self.eval_robot = None
        if self.mixture:
            demos = [e.name for e in self.mixture.embodiments if is_demo_dataset(e.root)]
            self.eval_robot = demos[0] if demos else None
        demo = self.eval_robot is not None or (not self.mixture and is_demo_dataset(cfg.data.root))
        self.eval_episodes = cfg.eval.episodes if demo else 0
        self.metaworld_tasks: list[str] = []  # eval.env=metaworld: the tasks scored
        if cfg.eval.env == "metaworld" and cfg.eval.episodes:
            self.metaworld_tasks = eval_tasks(cfg.eval.tasks, self.view.tasks)
            self.eval_episodes = cfg.eval.episodes
        self.logger = self._open_logger() if self.rank == 0 else None
        self.samples = self._open_samples_log()
        self.val = self._val_batches()

    # -- build ---------------------------------------------------------------------------
    def _build(self) -> None:
        """Rank 0 alone builds the full init source (seeded init, then `model.init_from`);
        every rank shards an empty meta model and receives its shards from rank 0. A checkpoint
        loaded afterwards overwrites them; frozen parameters keep the init source's values."""
        cfg = self.cfg
        check_roles(cfg.optimizer, self.family.roles, self.family.name)
        source = None
        if self.rank == 0:
            source = build_init_source(
                self.family, self.model_config, cfg.train.seed, cfg.model.init_from,
                cfg.model.init_allow,
            )  # fmt: skip
        model = meta_model(self.family, self.model_config)
        self.frozen = freeze_for_config(model, cfg.optimizer)
        self.frozen_placement = place_frozen(
            cfg.train.frozen_params,
            frozen_bytes(model, self.frozen, cfg.train.precision),
            rank_memory_bytes(self.device, self.session.local_world_size),
        )
        replicated = self.frozen if self.frozen_placement == "replicate" else []
        # A frozen copy kept in a lower precision than its source is exported from the source.
        self.frozen_lowered = bool(replicated) and cfg.train.precision != "fp32"
        self.flops_per_sample = 0.0  # counted and logged by rank 0 only
        storage = torch.device("cpu") if cfg.train.cpu_offload else self.device
        checksum = None
        if source is not None:
            freeze_for_config(source, cfg.optimizer)
            checksum = frozen_checksum(source, self.frozen) if self.frozen else []
            # Count where the model will run: a forward and backward of `base` is slow on CPU.
            source = source.to(storage)
            example = self.processor.collate(
                self.processor.encode(example_columns(self.view.spec, self.view.tasks)), storage
            )
            self.flops_per_sample = training_flops_per_sample(source, example)
        self.peak_tflops = peak_tflops(self.device, cfg.train.precision, cfg.train.peak_tflops)
        groups = resolve_groups(model, cfg.optimizer)
        self.comm = CommCounter()
        mesh = build_mesh(self.device.type, self.world, cfg.train.dp_shard)
        apply_fsdp(model, mesh, cfg.train, replicated, self.comm)
        materialize_from_rank0(model, source.state_dict() if source is not None else None, storage)
        del source
        register_fsdp_forward_method(model, "sample_actions")
        self.model = model
        # From rank 0's full-precision source: a replicated frozen copy may be in bf16.
        self.frozen_sum = _from_rank0(checksum)
        self.optimizer = build_optimizer(model, groups, cfg.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.steps, cfg.scheduler)

        def noise_fn(step: int, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            return flow_noise_and_time(cfg.train.seed, step, ids, model.noise_shape)

        nan_step = cfg.debug.nan_loss_step if self.rank == cfg.debug.nan_loss_rank else -1
        self.runner = StepRunner(
            model, self.optimizer, self.scheduler, groups, noise_fn, cfg.train.grad_clip,
            nan_loss_step=nan_step, max_consecutive_skipped=cfg.train.max_consecutive_skipped_updates,
        )  # fmt: skip

    def _restore(self) -> int:
        """The step to start from: 0, or the latest checkpoint's after loading it."""
        with self.session.latest_checkpoint() as ckpt_dir, ExitStack() as copies:
            if ckpt_dir is None:
                return 0
            chosen = self._sound_checkpoint(self._in_storage(ckpt_dir), copies)
            state = load_checkpoint(
                chosen, self.model, self.optimizer, self.scheduler, self.rank, self.world,
                self.frozen,
            )  # fmt: skip
        recipe = recipe_problems(chosen, state.config_hash, self.cfg)
        if (
            recipe
            or state.dataset_fingerprint != self.view.fingerprint
            or state.sample_plan != self.view.plan.version
        ):
            raise ValueError(
                f"checkpoint of run '{state.run_name}' was made with a different recipe or dataset "
                f"(recipe {recipe or 'unchanged'}, dataset "
                f"{state.dataset_fingerprint} vs {self.view.fingerprint}, sample plan "
                f"{state.sample_plan} vs {self.view.plan.version}); use a new ray.run_name"
            )
        init_source = f"model.init_from={self.cfg.model.init_from or '(none: seeded init)'}"
        check_frozen(state, self.frozen_sum, init_source)
        return state.step

    def _in_storage(self, located: Path | str) -> RunPath:
        """The session's checkpoint as a path in the run directory (see `Session`)."""
        if is_remote(self.run_dir):
            return self.run_dir / PurePosixPath(str(located)).name
        return Path(located)

    def _sound_checkpoint(self, latest: RunPath, copies: ExitStack) -> Path:
        """`latest`, or the newest registered checkpoint before it whose files all match their
        manifest: a damaged one is named in one line and skipped, never loaded or retried.
        From an object store each candidate is downloaded (into `copies`) and checked there."""
        for candidate in resume_candidates(self.run_dir, latest):
            local = copies.enter_context(local_directory(candidate))
            problems = all_problems(local, self.rank, self.world)
            if not problems:
                try:
                    read_train_state(local)
                    return local
                except ValueError as err:
                    problems = [str(err)]
            if self.rank == 0:
                print(f"[raytrain_vla] skipping damaged checkpoint {candidate}: {problems[0]}")
        raise CheckpointDamaged(
            f"{self.run_dir}: no complete checkpoint to resume from (every registered one is "
            "damaged, see above); start a new run with --ray.resume=never"
        )

    def _open_logger(self) -> MetricsLogger:
        cfg = self.cfg
        if cfg.eval.episodes and not self.eval_episodes:
            data = "no dataset of data.mixture is" if self.mixture else f"{cfg.data.root} is not"
            print(f"[raytrain_vla] eval.episodes ignored: {data} the demo task's data")
        for name in prune_untracked_checkpoints(self.run_dir):
            print(f"[raytrain_vla] removed unregistered checkpoint {self.run_dir / name}")
        for note in self.family.notes(self.model_config):
            print(f"[raytrain_vla] {note}")
        return MetricsLogger(
            self.run_dir, cfg.logging, to_dict(cfg), cfg.train.steps,
            f"{cfg.ray.run_name}-{self.config_hash}", self.start_step,
        )  # fmt: skip

    # -- the step loop ---------------------------------------------------------------------
    def fit(self) -> None:
        cfg = self.cfg
        batches = train_stream(
            cfg, self.view, self.processor, self.start_step, self.rank, self.world
        )
        meter = ThroughputMeter(
            cfg.train.global_batch_size, self.flops_per_sample, self.peak_tflops, self.world,
            self.device,
        )  # fmt: skip
        for step in range(self.start_step, cfg.train.steps):
            micro = meter.fetch(lambda: self._next_micro_batches(batches))
            self.comm.take()  # what validation or an export moved is not this step's
            metrics = self.runner.run(step, micro)
            metrics.update(self.comm.take())
            meter.step_done()
            self.saver.poll()  # collective while a background save is in flight
            done = step + 1
            self._log_sample_ids(step, micro)
            if _due(done, cfg.train.log_interval, cfg.train.steps):
                metrics.update(meter.window_metrics())
                metrics.update(self._mixture_counts(done))
                if self.logger:
                    self.logger.log(done, metrics)
            val_metrics = {}
            if _due(done, cfg.train.val_interval, cfg.train.steps):
                val_metrics = self._validate(done)
            report = {"step": done, **{k: v for k, v in metrics.items() if "/" not in k}}
            report.update(val_metrics)  # only where it was measured: Tune schedules on it
            if _due(done, cfg.train.save_interval, cfg.train.steps):
                self._save(done, report)
            elif val_metrics:
                self.session.report(report)
            faults.after_step(cfg.debug, done, self.rank, self.run_dir)
            if cfg.debug.step_delay_s > 0:
                time.sleep(cfg.debug.step_delay_s)
            meter.restart_if_idle()  # validation and checkpoints stay out of step timing
        self._finish()

    def _next_micro_batches(self, batches: Iterator[dict]) -> list[dict]:
        return [self.processor.collate(next(batches), self.device) for _ in range(self.accum)]

    def _open_samples_log(self) -> JsonlLog | None:
        """`samples.jsonl`: every rank appends its own lines locally; an object store has no
        append, so there rank 0 gathers every rank's lines and alone writes the object."""
        if not self.cfg.debug.log_sample_ids or (is_remote(self.run_dir) and self.rank != 0):
            return None
        return JsonlLog(self.run_dir / "samples.jsonl")

    def _log_sample_ids(self, step: int, micro: list[dict]) -> None:
        if not self.cfg.debug.log_sample_ids:
            return
        ids = torch.cat([m["sample_ids"] for m in micro]).tolist()
        if self.mixture:  # "name:frame", the frame's index in its own dataset
            source = self.mixture.source
            ids = [
                f"{self.mixture.names[d]}:{i - source.offsets[d]}"
                for i, d in zip(ids, source.dataset_of(ids).tolist(), strict=True)
            ]
        record = {"step": step, "rank": self.rank, "world_size": self.world, "ids": ids}
        records = [record]
        if is_remote(self.run_dir) and dist.is_initialized():  # collective
            records = [None] * self.world
            dist.all_gather_object(records, record)
        if self.samples is not None:
            for r in records:
                self.samples.write(r)

    # -- interval hooks ------------------------------------------------------------------------
    def _val_batches(self) -> list[tuple[str, list]]:
        """(suffix, batches) to validate on: all held-out samples, or each dataset's of a
        mixture (scored in that robot's units against its own mean action)."""

        def batches(ids=None):
            return val_batches(
                self.cfg, self.view, self.processor, self.rank, self.world, self.device, ids
            )

        if not self.mixture:
            return [("", batches())]
        return [
            (e.name, batches(self.mixture.val_ids_of(e.index))) for e in self.mixture.embodiments
        ]

    def _validate(self, done: int) -> dict[str, float]:
        if not self.mixture:
            metrics = validate(
                self.model, self.val[0][1], self.processor, self.view.mean_action,
                self.cfg.train.seed,
            )  # fmt: skip
        else:
            metrics = self._validate_mixture()
        if self.eval_episodes and self.cfg.eval.at_validation:  # collective
            metrics.update(self._closed_loop_now())
        if self.logger:
            self.logger.log(done, metrics, kind="val")
        return metrics

    def _validate_mixture(self) -> dict[str, float]:
        """Each dataset's metrics under `<metric>/<name>`; `val_loss` and `val_mse_ratio` (what
        Tune schedules on) are their means weighted by held-out samples and unweighted."""
        out: dict[str, float] = {}
        losses, ratios, counts = [], [], []
        for (name, batches), emb in zip(self.val, self.mixture.embodiments, strict=True):
            m = validate(
                self.model, batches, EmbodimentActions(emb), np.asarray(emb.mean_action),
                self.cfg.train.seed,
            )  # fmt: skip
            for key in ("val_loss", "val_action_mse", "val_mse_ratio", "val_samples"):
                out[f"{key}/{name}"] = m[key]
            losses.append(m["val_loss"])
            ratios.append(m["val_mse_ratio"])
            counts.append(m["val_samples"])
        out["val_loss"] = float(np.average(losses, weights=counts))
        out["val_mse_ratio"] = float(np.mean(ratios))
        out["val_samples"] = float(np.sum(counts))
        return out

    def _mixture_counts(self, done: int) -> dict[str, float]:
        """Samples each dataset has given to steps [0, done) (the plan's closed form)."""
        if not self.mixture:
            return {}
        counts = self.mixture.plan.samples_before(done)
        return {f"samples/{n}": int(c) for n, c in zip(self.mixture.names, counts, strict=True)}

    def _save(self, done: int, report: dict) -> None:
        cfg = self.cfg
        cursor = self.view.plan.cursor_at(done)
        state = TrainState(
            step=done,
            epoch=cursor.epoch,
            sample_in_epoch=cursor.sample_in_epoch,
            samples_seen=done * cfg.train.global_batch_size,
            world_size=self.world,
            run_name=cfg.ray.run_name,
            config_hash=self.config_hash,
            dataset_fingerprint=self.view.fingerprint,
            sample_plan=self.view.plan.version,
            frozen_params=len(self.frozen),
            frozen_checksum=self.frozen_sum,
        )
        directory = new_checkpoint_directory(self.run_dir, done)
        write_sidecars(
            directory, self.scheduler, state, self.rank, to_yaml(cfg), self.view.normalizer,
            self.policy_meta,
        )  # fmt: skip
        background = cfg.train.async_checkpoint

        def report_complete() -> None:
            faults.in_checkpoint_write(cfg.debug, done, self.rank, self.run_dir)
            if self.logger:  # lines of steps up to a checkpoint are never lost (object stores)
                self.logger.flush()
            self.session.report(report, checkpoint_dir=directory, upload_in_background=background)
            if not background:  # Ray moved or copied it; in the background Ray deletes it once done
                shutil.rmtree(directory, ignore_errors=True)

        state_dicts = tensor_state(self.model, self.optimizer, self.frozen)
        self.saver.save(directory, state_dicts, self.rank, report_complete)

    def _closed_loop_now(self) -> dict[str, float]:
        """Collective: the policy's closed-loop success now; rank 0 runs it on gathered weights."""
        state = gather_full_state(self.model)
        if self.rank != 0:
            return {}
        ev = self.cfg.eval
        if self.metaworld_tasks:
            make_policy = functools.partial(
                policy_lib.from_state, state, self.policy_meta, self.view.normalizer, ev.seed,
                ev.n_action_steps,
            )  # fmt: skip
            return self._metaworld_scores(make_policy, ("policy",), record=0)[0]
        live = policy_lib.from_state(
            state, self.policy_meta, self.view.normalizer, ev.seed, ev.n_action_steps
        )
        live = live.for_embodiment(self.eval_robot) if self.eval_robot else live
        result = run_episodes(
            "policy", live.select_action, live.reset, self.eval_episodes, ev.seed,
            render_size(live),
        )  # fmt: skip
        return {
            "eval_success_rate": result.success_rate,
            "eval_final_distance": result.mean_final_distance,
        }

    def _metaworld_scores(
        self, make_policy: PolicyFactory, controllers: tuple[str, ...], record: int
    ) -> tuple[dict[str, float], list[Episode]]:
        """Rank 0: Meta-World success of each controller, overall, by group and per task, as
        metrics (`eval_success_rate...` for the policy alone at validation)."""
        ev = self.cfg.eval
        image_size = policy_image_size(self.policy_meta.data_spec)
        scores, recorded = evaluate_metaworld(
            make_policy, self.metaworld_tasks, self.eval_episodes, ev.seed, image_size,
            controllers, ev.max_steps, record, ev.workers, num_cpus=0,
        )  # fmt: skip
        prefix = "eval" if controllers == ("policy",) else None
        metrics: dict[str, float] = {}
        for name, score in scores.items():
            key = f"{prefix or name}_success_rate"
            metrics[key] = score.success_rate
            metrics.update({f"{key}/{g}": v for g, v in score.by_group.items()})
            metrics.update({f"{key}/{t}": v for t, v in score.per_task.items()})
        return metrics, recorded

    # -- end of run --------------------------------------------------------------------------
    def _frozen_from_source(self) -> dict[str, torch.Tensor]:
        """The frozen weights as the init source holds them (this run kept a bf16 copy)."""
        cfg = self.cfg
        source = build_init_source(
            self.family, self.model_config, cfg.train.seed, cfg.model.init_from,
            cfg.model.init_allow,
        )  # fmt: skip
        full = source.state_dict()
        return {name: full[name] for name in self.frozen}

    def _finish(self) -> None:
        """Export the policy (full weights gathered on rank 0), then score it in closed loop."""
        self.saver.close()  # the last checkpoint is complete and reported before the export
        export_dir = self.run_dir / "export"
        state = gather_full_state(self.model)
        if self.rank == 0 and self.frozen_lowered:
            state.update(self._frozen_from_source())
        if self.rank == 0:
            write_policy(export_dir, state, self.policy_meta, self.view.normalizer)
        if dist.is_initialized():
            dist.barrier()
        if not self.logger:
            return
        if self.metaworld_tasks:
            ev = self.cfg.eval
            make_policy = functools.partial(
                policy_lib.load, export_dir, seed=ev.seed, n_action_steps=ev.n_action_steps
            )
            metrics, recorded = self._metaworld_scores(
                make_policy, CONTROLLERS, record=ev.rollouts_logged
            )
            self.logger.log_metaworld_eval(self.cfg.train.steps, metrics, recorded)
        elif self.eval_episodes:
            ev = self.cfg.eval
            exported = policy_lib.load(export_dir, seed=ev.seed, n_action_steps=ev.n_action_steps)
            if self.eval_robot:
                exported = exported.for_embodiment(self.eval_robot)
            results = evaluate(exported, self.eval_episodes, ev.seed, record=ev.rollouts_logged)
            self.logger.log_eval(self.cfg.train.steps, results)
        self.logger.close()


def _from_rank0(value: list[float] | None) -> list[float]:
    """Collective when distributed: rank 0's value on every rank."""
    if not dist.is_initialized():
        return value or []
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
