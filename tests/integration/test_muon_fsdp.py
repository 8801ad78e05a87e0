"""Muon on FSDP2 shards changes every matrix exactly as torch.optim.Muon changes the whole matrix
in one process (and AdamW's parameters as torch's AdamW does), at W = 2 and 4 and on a 2 x 2
HSDP mesh, with uneven and empty row shards. Each rank's step is compared with torch's on the
same whole gradients (gathered for the check only). No Ray: gloo processes."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from _spawn import run_distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from raytrain_vla.train.muon import MuonAdamW, muon_parameter_names
from raytrain_vla.train.newton_schulz import NewtonSchulz

LR, WD = 0.02, 0.01


class Block(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)  # (hidden, width): uneven row shards
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.blocks = nn.ModuleList([Block(8, 13), Block(8, 6)])
        self.lm_head = nn.Linear(8, 3)  # 3 rows: on 4 ranks one shard is empty

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


class CountingNS(NewtonSchulz):
    """Counts the whole matrices this rank orthogonalised."""

    def __call__(self, matrix: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(matrix.shape))
        return super().__call__(matrix)


def _groups(model: nn.Module, muon: set[str]) -> list[dict]:
    named = dict(model.named_parameters())
    return [
        {"params": [named[n] for n in named if n in muon], "lr": LR, "weight_decay": WD,
         "muon": True, "name": "muon"},
        {"params": [named[n] for n in named if n not in muon], "lr": LR, "weight_decay": WD,
         "name": "adamw"},
    ]  # fmt: skip


def muon_step_program(
    rank: int, world: int, hsdp: bool = False, dtype: torch.dtype = torch.bfloat16
) -> dict:
    """bf16: against torch.optim.Muon; another dtype: against our optimizer in one process on
    the whole matrices with the same Newton-Schulz (torch's has no dtype to choose)."""
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    muon = muon_parameter_names(model, ["embed", "lm_head"])
    mesh = (
        init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        if hsdp
        else init_device_mesh("cpu", (world,))
    )
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ns = CountingNS(dtype=dtype)
    object.__setattr__(ns, "calls", [])
    opt = MuonAdamW(_groups(model, muon), lr=LR, betas=(0.9, 0.95), eps=1e-8, newton_schulz=ns)
    ref_named = dict(reference.named_parameters())
    ref_muon = (
        torch.optim.Muon(
            [ref_named[n] for n in ref_named if n in muon], lr=LR, weight_decay=WD,
            adjust_lr_fn="match_rms_adamw",
        )
        if dtype == torch.bfloat16
        else MuonAdamW(
            _groups(reference, muon)[:1], lr=LR, betas=(0.9, 0.95), eps=1e-8,
            newton_schulz=NewtonSchulz(dtype=dtype),
        )
    )  # fmt: skip
    ref_adamw = torch.optim.AdamW(
        [ref_named[n] for n in ref_named if n not in muon], lr=LR, weight_decay=WD,
        betas=(0.9, 0.95), eps=1e-8, foreach=True,
    )  # fmt: skip
    unequal, largest = [], 0.0
    for step in range(3):
        tokens = torch.randint(0, 11, (4, 5), generator=torch.Generator().manual_seed(step + rank))
        model(tokens).pow(2).mean().backward()
        for name, p in model.named_parameters():  # torch's optimizers get the same gradients
            ref_named[name].grad = p.grad.full_tensor()
        opt.step()
        ref_muon.step()
        ref_adamw.step()
        opt.zero_grad()
        for name, p in model.named_parameters():
            full = p.full_tensor()
            largest = max(largest, float((full - ref_named[name]).abs().max()))
            if not torch.equal(full, ref_named[name]):
                unequal.append(f"step {step} {name}")
    owned = torch.tensor([len(ns.calls)])
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(counts, owned)
    return {
        "unequal": unequal, "largest": largest, "owned": [int(c) for c in counts],
        "muon_matrices": len(muon), "comm_bytes": opt.comm_bytes,
    }  # fmt: skip


def hsdp_program(rank: int, world: int) -> dict:
    return muon_step_program(rank, world, hsdp=True)


def fp32_program(rank: int, world: int) -> dict:
    return muon_step_program(rank, world, dtype=torch.float32)


def _check(result: dict, owners: int, steps: int = 3) -> None:
    assert result["unequal"] == [], (result["unequal"], result["largest"])
    assert result["muon_matrices"] == 4  # up and down of each block; embed and lm_head excluded
    # each matrix is orthogonalised once per step in each shard group, by one owner, and the
    # owners share the work evenly (4 matrices over `owners` ranks)
    per_rank = [n / steps for n in result["owned"]]
    groups = len(per_rank) // owners
    assert sum(per_rank) == 4 * groups and max(per_rank) - min(per_rank) <= 1, per_rank
    assert result["comm_bytes"] > 0


def test_muon_on_two_ranks_equals_torch_on_whole_matrices(tmp_path):
    _check(run_distributed(muon_step_program, tmp_path, world=2), owners=2)


def test_muon_on_four_ranks_with_an_empty_shard(tmp_path):
    _check(run_distributed(muon_step_program, tmp_path, world=4), owners=4)


def test_muon_on_a_two_by_two_hsdp_mesh(tmp_path):
    _check(run_distributed(hsdp_program, tmp_path, world=4), owners=2)


def test_fp32_newton_schulz_on_two_ranks_equals_one_process(tmp_path):
    _check(run_distributed(fp32_program, tmp_path, world=2), owners=2)
