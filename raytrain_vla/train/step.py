"""One optimizer step: gradient accumulation, non-finite guards, global clipping, update.

Every rank runs exactly the same collectives in the same order whatever its data holds, so a NaN
on one rank can never deadlock the others:
1. samples whose inputs are non-finite are zeroed and weighted out of the loss;
2. a non-finite micro-batch loss is replaced by zero (backward still runs, hooks still fire);
3. if the reduced global gradient norm is still non-finite, every rank sees the same value and
   all of them drop the update together.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from raytrain_vla.errors import NotRetriable
from raytrain_vla.train.optim import ParamGroup
from raytrain_vla.train.shards import local_shard

NoiseFn = Callable[[int, list[int]], tuple[torch.Tensor, torch.Tensor]]


def _copies(t: torch.Tensor) -> int:
    """How many ranks hold each shard of `t`: the replicate degree under HSDP, else 1. Summing
    squares over every rank then counts each gradient element that many times."""
    placements = getattr(t, "placements", ())
    mesh = getattr(t, "device_mesh", None)
    return math.prod(mesh.size(i) for i, p in enumerate(placements) if p.is_replicate())


def _float_tensors(batch: dict) -> list[torch.Tensor]:
    """Every floating-point input of a model batch (nested dicts such as cameras included)."""
    out = []
    for value in batch.values():
        if isinstance(value, dict):
            out += _float_tensors(value)
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            out.append(value)
    return out


def _zero_non_finite(batch: dict) -> dict:
    clean = {}
    for key, value in batch.items():
        if isinstance(value, dict):
            clean[key] = _zero_non_finite(value)
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            clean[key] = torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0)
        else:
            clean[key] = value
    return clean


def sanitize_inputs(batch: dict) -> tuple[dict, torch.Tensor]:
    """Zero non-finite inputs and return a per-sample weight that drops those samples."""
    actions = batch["actions"]
    bad = torch.zeros(actions.shape[0], dtype=torch.bool, device=actions.device)
    for t in _float_tensors(batch):
        bad |= ~torch.isfinite(t).reshape(t.shape[0], -1).all(dim=1)
    return _zero_non_finite(batch), (~bad).to(actions.dtype)


class TrainingDiverged(NotRetriable, RuntimeError):
    """Updates were skipped for non-finite gradients too many steps in a row."""


class StepRunner:
    """Owns the per-step math so the Ray loop, the benchmarks and the tests share it."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        groups: list[ParamGroup],
        noise_fn: NoiseFn,
        grad_clip: float,
        nan_loss_step: int = -1,
        max_consecutive_skipped: int = 20,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.noise_fn = noise_fn
        self.grad_clip = grad_clip
        self.nan_loss_step = nan_loss_step
        self.max_consecutive_skipped = max_consecutive_skipped
        self.skipped_in_a_row = 0
        self.last_applied: tuple[int, float] | None = None  # (step, loss) of the last update
        params = dict(model.named_parameters())
        self.group_names = [g.name for g in groups]
        self.group_params = [[params[n] for n in g.param_names] for g in groups]
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.device = next(model.parameters()).device

    def run(self, step: int, micro_batches: list[dict]) -> dict[str, float]:
        """Accumulate over `micro_batches` (this rank's share of one global batch) and update."""
        metrics = self.update(*self.accumulate(step, micro_batches))
        self._guard_skipped_updates(step, metrics)
        return metrics

    def _guard_skipped_updates(self, step: int, metrics: dict[str, float]) -> None:
        """Stop a run that no longer trains: every rank sees the same all-reduced verdict, so
        every rank raises at the same step and none waits in a collective."""
        if not metrics["update_skipped"]:
            self.skipped_in_a_row = 0
            self.last_applied = (step, metrics["loss"])
            return
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row < self.max_consecutive_skipped:
            return
        last = (
            f"the last applied update was step {self.last_applied[0]} at loss "
            f"{self.last_applied[1]:.6g}"
            if self.last_applied
            else "no update was applied since this attempt started"
        )
        raise TrainingDiverged(
            f"step {step}: {self.skipped_in_a_row} updates in a row skipped for non-finite "
            f"gradients ({last}); lower the learning rate or check the data "
            f"(train.max_consecutive_skipped_updates={self.max_consecutive_skipped})"
        )

    def accumulate(self, step: int, micro_batches: list[dict]) -> tuple[torch.Tensor, ...]:
        """Forward/backward every micro-batch; gradients end up reduced (and sharded under FSDP).

        The loss is summed over samples and divided by this rank's sample count; FSDP's average
        over ranks then makes it the mean over the global batch, for any world size.
        """
        accum = len(micro_batches)
        rank_samples = sum(len(mb["sample_ids"]) for mb in micro_batches)
        loss_sum = torch.zeros((), device=self.device)
        zeroed = torch.zeros((), device=self.device)
        bad_samples = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            if isinstance(self.model, FSDPModule):
                # Only the last micro-step reduce-scatters; earlier ones accumulate locally.
                self.model.set_requires_gradient_sync(i == accum - 1)
            batch, weight = sanitize_inputs(batch)
            noise, time = self.noise_fn(step, batch["sample_ids"].tolist())
            per_sample = self.model.compute_loss(batch, noise.to(self.device), time.to(self.device))
            loss = (per_sample * weight).sum() / rank_samples
            if step == self.nan_loss_step:
                loss = loss + float("nan")
            finite = torch.isfinite(loss)
            loss = torch.where(finite, loss, torch.zeros_like(loss))
            loss.backward()
            loss_sum += loss.detach()
            zeroed += (~finite).float()
            bad_samples += (weight == 0).sum()
        return loss_sum, zeroed, bad_samples

    def update(self, loss_sum: torch.Tensor, zeroed: torch.Tensor, bad: torch.Tensor) -> dict:
        # One all-reduce carries per-group squared grad norms plus the loss and guard counters.
        # Under HSDP every replica holds the same shards: each counts 1/replicas of its squares.
        squares = []
        for params in self.group_params:
            sq = torch.zeros((), device=self.device)
            for p in params:
                if p.grad is not None:
                    sq = sq + local_shard(p.grad).float().pow(2).sum() / _copies(p.grad)
            squares.append(sq)
        packed = torch.stack([*squares, loss_sum, zeroed, bad])
        if self.distributed:
            dist.all_reduce(packed)
        group_sq = packed[: len(squares)]
        total_norm = group_sq.sum().sqrt()
        finite = bool(torch.isfinite(total_norm))
        if finite:
            coef = (
                torch.clamp(self.grad_clip / (total_norm + 1e-6), max=1.0)
                if self.grad_clip > 0
                else None
            )
            if coef is not None:
                for params in self.group_params:
                    for p in params:
                        if p.grad is not None:
                            local_shard(p.grad).mul_(coef)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lrs = {f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups}
        self.scheduler.step()
        metrics = {
            "loss": float(packed[len(squares)]) / self.world_size,
            "grad_norm": float(total_norm),
            "nonfinite_losses_zeroed": float(packed[len(squares) + 1]),
            "nonfinite_samples_dropped": float(packed[len(squares) + 2]),
            "update_skipped": 0.0 if finite else 1.0,
        }
        metrics.update(
            {
                f"grad_norm/{n}": float(v.sqrt())
                for n, v in zip(self.group_names, group_sq, strict=True)
            }
        )
        metrics.update(lrs)
        if finite and coef is not None:
            metrics["clip_coef"] = float(coef)  # one for every group: clipping is global
        for name, rms in getattr(self.optimizer, "update_rms", {}).items():
            metrics[f"muon/update_rms/{name}"] = rms  # Muon's orthogonalised update, this rank
        if hasattr(self.optimizer, "comm_bytes"):
            metrics["comm/muon_bytes"] = float(self.optimizer.comm_bytes)
        return metrics
