"""Muon in one process: torch.optim.Muon's update to the bit (AdamW's for the rest), which
parameters it takes, how LR groups split, and the refusals before Ray starts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from raytrain_vla.config import ConfigError, parse_cli
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.muon import MuonAdamW, muon_parameter_names
from raytrain_vla.train.optim import build_optimizer, optimizer_summary, resolve_groups

DEFAULT_EXCLUDE = ["embed", "lm_head", r"(^|[._])(state|action)_(in|out|proj)"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.state_proj = nn.Linear(3, 8)
        self.hidden = nn.Linear(8, 12)
        self.norm = nn.LayerNorm(12)
        self.conv = nn.Conv1d(12, 12, 1)
        self.lm_head = nn.Linear(12, 5)

    def forward(self, tokens, state):
        x = self.embed(tokens) + self.state_proj(state)
        x = self.norm(torch.tanh(self.hidden(x)))
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        return self.lm_head(x)


def test_only_hidden_linear_weights_go_to_muon():
    assert muon_parameter_names(Net(), DEFAULT_EXCLUDE) == {"hidden.weight"}
    assert muon_parameter_names(Net(), []) == {
        "state_proj.weight",
        "hidden.weight",
        "lm_head.weight",
    }


@pytest.mark.parametrize("nesterov,adjust", [(True, "match_rms_adamw"), (False, "original")])
def test_one_process_equals_torch_muon_and_adamw_bit_for_bit(nesterov, adjust):
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    muon = muon_parameter_names(model, DEFAULT_EXCLUDE)
    named, ref = dict(model.named_parameters()), dict(reference.named_parameters())
    groups = [
        {"params": [named[n] for n in named if n in muon], "lr": 0.02, "weight_decay": 0.1,
         "muon": True, "name": "m"},
        {"params": [named[n] for n in named if n not in muon], "lr": 0.01, "weight_decay": 0.01},
    ]  # fmt: skip
    opt = MuonAdamW(
        groups, lr=0.01, betas=(0.9, 0.95), eps=1e-8, nesterov=nesterov, adjust_lr=adjust
    )
    ref_muon = torch.optim.Muon(
        [ref[n] for n in ref if n in muon], lr=0.02, weight_decay=0.1, nesterov=nesterov,
        adjust_lr_fn=adjust,
    )  # fmt: skip
    ref_adamw = torch.optim.AdamW(
        [ref[n] for n in ref if n not in muon], lr=0.01, weight_decay=0.01, betas=(0.9, 0.95),
        eps=1e-8, foreach=True,
    )  # fmt: skip
    for step in range(3):
        tokens = torch.randint(0, 10, (2, 4), generator=torch.Generator().manual_seed(step))
        state = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(step))
        for m in (model, reference):
            m.zero_grad()
            m(tokens, state).pow(2).mean().backward()
        opt.step()
        ref_muon.step()
        ref_adamw.step()
    for name, param in named.items():
        assert torch.equal(param, ref[name]), name
    assert set(opt.update_rms) == {"m"} and opt.update_rms["m"] > 0
    assert opt.comm_bytes == 0  # nothing sharded, nothing moved


def tiny_flow_vla() -> nn.Module:
    from raytrain_vla.common.spec import DataSpec

    family = get_family("flow_vla")
    spec = DataSpec({"observation.image": (3, 32, 32)}, state_dim=3, action_dim=2, chunk_size=4)
    return family.build(family.resolve_config(family.tiny_options(None), spec))


def test_lr_groups_split_into_muon_and_adamw_halves_with_the_scaled_lr():
    cfg = parse_cli(["--optimizer.type=muon", "--optimizer.muon.lr_scale=2.0"])
    model = tiny_flow_vla()
    opt = build_optimizer(model, resolve_groups(model, cfg.optimizer), cfg.optimizer)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert {"backbone", "backbone/muon", "action_expert", "action_expert/muon"} <= set(by_name)
    assert by_name["backbone/muon"]["lr"] == 2 * by_name["backbone"]["lr"]
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.param_groups if g.get("muon") for p in g["params"]}
    assert "backbone.blocks.0.attn.q.weight" in muon
    assert not any(k in n for n in muon for k in ("state_proj", "action_in", "action_out", "bias"))
    summary = optimizer_summary(opt)
    assert summary.startswith("adamw: ") and "muon: " in summary


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--optimizer.muon.lr_scale=2"],
            "'optimizer.muon.lr_scale' is set but optimizer.type is 'adamw'",
        ),
        (
            ["--optimizer.type=muon", "--train.cpu_offload=true"],
            "does not support train.cpu_offload",
        ),
        (["--optimizer.type=muon", "--optimizer.muon.ns_steps=0"], "'optimizer.muon.ns_steps'"),
        (
            ["--optimizer.type=muon", "--optimizer.muon.ns_dtype=float16"],
            "'optimizer.muon.ns_dtype'",
        ),
        (["--optimizer.muon.ns_dtype=float32"], "'optimizer.muon.ns_dtype' is set but"),
        (["--optimizer.type=muon", '--optimizer.muon.exclude_patterns=["("]'], "not a regex"),
    ],
)
def test_settings_muon_cannot_serve_are_refused_naming_the_key(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cli(args)


def test_frozen_roles_stay_out_of_both_halves():
    cfg = parse_cli(["--optimizer.type=muon", "--optimizer.freeze_roles=[vision]"])
    from raytrain_vla.train.optim import freeze_for_config

    model = tiny_flow_vla()
    frozen = set(freeze_for_config(model, cfg.optimizer))
    opt = build_optimizer(model, resolve_groups(model, cfg.optimizer), cfg.optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    in_optimizer = {names[id(p)] for g in opt.param_groups for p in g["params"]}
    assert frozen and all(n.startswith("vision.") for n in frozen)
    assert not in_optimizer & frozen
    assert {g["name"] for g in opt.param_groups} >= {"backbone/muon", "action_expert/muon"}
    assert not any(g["name"].startswith("vision") for g in opt.param_groups)


def test_newton_schulz_op_for_op_is_torchs_in_bf16_and_runs_in_fp32_when_asked():
    """Our iteration, in bf16, gives torch's bits: so the fp32 one is torch's algorithm at
    another precision, not a different optimizer. Wide and tall matrices (tall: transposed)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from raytrain_vla.train.newton_schulz import NewtonSchulz, newton_schulz

    ns = NewtonSchulz()
    for shape in [(16, 40), (40, 16)]:
        m = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
        kept = m.clone()
        ours = newton_schulz(m, ns.coefficients, ns.steps, ns.eps, torch.bfloat16)
        assert torch.equal(ours, _zeropower_via_newtonschulz(m, ns.coefficients, 5, ns.eps))
        fp32 = NewtonSchulz(dtype=torch.float32)(m)
        assert fp32.dtype == torch.float32 and torch.equal(m, kept)  # the input is untouched
        assert (fp32 - ours.float()).abs().max() < 0.02
        # orthogonalised: the singular values land near 1 (Muon's quintic leaves 0.5-1.5)
        singular = torch.linalg.svdvals(fp32)
        assert 0.5 < float(singular.min()) and float(singular.max()) < 1.5


def test_ns_dtype_reaches_the_optimizer():
    cfg = parse_cli(["--optimizer.type=muon", "--optimizer.muon.ns_dtype=float32"])
    model = tiny_flow_vla()
    opt = build_optimizer(model, resolve_groups(model, cfg.optimizer), cfg.optimizer)
    assert opt.newton_schulz.dtype == torch.float32
