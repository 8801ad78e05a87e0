"""Muon for the hidden weight matrices, AdamW for everything else, as one optimizer.

One optimizer object, so the trainer's step, the LR scheduler (every group, Muon's too) and DCP
checkpoints (`get_state_dict(model, optimizer)`) need no second path. Each LR group is split in
two torch groups with the same LR and weight decay: its Muon matrices (`muon: True`) and the
rest. The AdamW groups are stepped by torch's own AdamW (`super().step()` over them alone), the
Muon groups by torch.optim.Muon's update with the Newton-Schulz step done on whole matrices
(`newton_schulz.orthogonalize`): on one rank the result equals `torch.optim.Muon`'s bit for bit,
and on W ranks each shard changes exactly as the whole matrix would.

Which parameters get Muon: the weight of an `nn.Linear` (a hidden 2-D matrix) whose name no
pattern of `optimizer.muon.exclude_patterns` matches (by default embeddings and LM heads);
embeddings, norms, biases, convolutions and anything not 2-D stay with AdamW.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from raytrain_vla.train.newton_schulz import NewtonSchulz, orthogonalize
from raytrain_vla.train.shards import local_shard

ADJUST_LR = ("match_rms_adamw", "original")


def muon_parameter_names(model: nn.Module, exclude_patterns: Iterable[str]) -> set[str]:
    """The parameters Muon updates: `nn.Linear` weights (2-D) not matched by a pattern."""
    patterns = [re.compile(p) for p in exclude_patterns]
    names = set()
    for module_name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module.weight.ndim != 2:
            continue
        name = f"{module_name}.weight" if module_name else "weight"
        if not any(p.search(name) for p in patterns):
            names.add(name)
    return names


def adjusted_lr(lr: float, shape: torch.Size, rule: str) -> float:
    """torch.optim.Muon's LR adjustment for a matrix's whole shape: `match_rms_adamw` keeps
    the update's RMS that of AdamW (so AdamW's LRs and schedules keep their meaning)."""
    rows, cols = shape[:2]
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1, rows / cols))


class MuonAdamW(torch.optim.AdamW):
    """AdamW over the groups without `muon`, Muon over those with `muon: True`."""

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        momentum: float = 0.95,
        nesterov: bool = True,
        newton_schulz: NewtonSchulz | None = None,
        adjust_lr: str = "match_rms_adamw",
    ):
        if adjust_lr not in ADJUST_LR:
            raise ValueError(f"adjust_lr: {adjust_lr!r}, expected one of {ADJUST_LR}")
        for group in groups:
            group.setdefault("muon", False)
            bad = [tuple(p.shape) for p in group["params"] if group["muon"] and p.ndim != 2]
            if bad:
                raise ValueError(f"Muon group {group.get('name')!r} has non-matrix shapes {bad}")
        super().__init__(groups, lr=lr, betas=betas, eps=eps, foreach=True)
        self.momentum, self.nesterov = momentum, nesterov
        self.newton_schulz, self.adjust_lr = newton_schulz or NewtonSchulz(), adjust_lr
        self.comm_bytes = 0  # sent and received by the last step's Newton-Schulz gathers
        self.update_rms: dict[str, float] = {}  # each Muon group's last update RMS (this rank)

    @torch.no_grad()
    def step(self, closure=None):
        everything = self.param_groups
        try:  # torch's own AdamW over the AdamW groups alone
            self.param_groups = [g for g in everything if not g["muon"]]
            loss = super().step(closure)
        finally:
            self.param_groups = everything
        self._muon_step([g for g in everything if g["muon"]])
        return loss

    def _muon_step(self, groups: list[dict]) -> None:
        params, updates, owners = [], [], []
        for group in groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = local_shard(p.grad)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                    # AdamW's state layout (`step` as a tensor): torch's Adam reads it for
                    # every parameter when a state dict is loaded
                    state["step"] = torch.tensor(0.0)
                state["step"] += 1
                buf = local_shard(state["momentum_buffer"])
                buf.lerp_(grad, 1 - self.momentum)
                updates.append(grad.lerp(buf, self.momentum) if self.nesterov else buf)
                params.append(p)
                owners.append(group)
        ortho, self.comm_bytes = orthogonalize(updates, params, self.newton_schulz)
        names = list(dict.fromkeys(g.get("name", "muon") for g in owners))
        squares = torch.zeros(len(names), 2, dtype=torch.float64)
        for p, group, update in zip(params, owners, ortho, strict=True):
            lr, weight_decay = group["lr"], group["weight_decay"]
            local = local_shard(p)
            local.mul_(1 - lr * weight_decay)
            local.add_(update, alpha=-adjusted_lr(lr, p.shape, self.adjust_lr))
            row = squares[names.index(group.get("name", "muon"))]
            row += torch.tensor([update.double().pow(2).sum().item(), update.numel()])
        if dist.is_initialized() and dist.get_world_size() > 1 and names:
            dist.all_reduce(squares)  # replicas count every element alike: the RMS is unmoved
        self.update_rms = {
            n: math.sqrt(float(s) / max(float(c), 1.0))
            for n, (s, c) in zip(names, squares, strict=True)
        }
