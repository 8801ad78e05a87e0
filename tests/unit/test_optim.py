"""LR groups, freezing and the schedule: plain torch, no Ray."""

import pytest
import torch

from raytrain_vla.config.schema import LRGroupConfig, OptimizerConfig, SchedulerConfig
from raytrain_vla.models.checks import check_roles
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    lr_factor,
    resolve_groups,
)

ROLES = ("vision", "backbone", "action_expert")


def tiny() -> FlowVLA:
    torch.manual_seed(0)
    return FlowVLA(FlowVLAConfig.from_size("tiny"))


@pytest.fixture(scope="module")
def model():
    return tiny()


def test_default_groups_hold_exactly_their_role(model):
    groups = {g.name: set(g.param_names) for g in resolve_groups(model, OptimizerConfig())}
    names = {n for n, _ in model.named_parameters()}
    for role in ROLES:
        assert groups[role] == {n for n in names if model.role_of(n) == role}
        assert groups[role] == {n for n in names if n.startswith(f"{role}.")}  # its tower
    assert "default" not in groups  # the three roles cover every parameter


def test_first_match_wins_and_leftovers_go_to_default(model):
    cfg = OptimizerConfig(
        lr=0.5,
        groups=[
            LRGroupConfig("film", [r"\.films\."], 1e-2, 0.0),
            LRGroupConfig("vision", lr=1e-3, weight_decay=0.1, roles=["vision"]),
        ],
    )
    groups = {g.name: g for g in resolve_groups(model, cfg)}
    assert all(".films." in n for n in groups["film"].param_names)
    assert not any(".films." in n for n in groups["vision"].param_names)
    assert all(not n.startswith("vision.") for n in groups["default"].param_names)
    optimizer = build_optimizer(model, list(groups.values()), cfg)
    by_name = {g["name"]: g for g in optimizer.param_groups}
    assert (by_name["film"]["lr"], by_name["vision"]["weight_decay"], by_name["default"]["lr"]) == (
        1e-2,
        0.1,
        0.5,
    )
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


def test_group_matching_nothing_is_an_error(model):
    cfg = OptimizerConfig(groups=[LRGroupConfig("typo", [r"^visoin\."], 1e-3, 0.0)])
    with pytest.raises(ValueError, match=r"\['typo'\] match no parameter"):
        resolve_groups(model, cfg)


def test_train_action_expert_only_freezes_every_other_role():
    m = tiny()
    cfg = OptimizerConfig(train_action_expert_only=True)
    frozen = freeze_for_config(m, cfg)
    assert frozen and {m.role_of(n) for n in frozen} == {"vision", "backbone"}
    assert all(p.requires_grad == (n not in frozen) for n, p in m.named_parameters())
    groups = resolve_groups(m, cfg)  # the vision and backbone groups hold only frozen ones
    assert [g.name for g in groups] == ["action_expert"]


def test_freeze_roles_and_typos_in_roles():
    m = tiny()
    frozen = freeze_for_config(m, OptimizerConfig(freeze_roles=["vision"]))
    assert {m.role_of(n) for n in frozen} == {"vision"}
    assert [g.name for g in resolve_groups(m, OptimizerConfig())] == ["backbone", "action_expert"]
    check_roles(OptimizerConfig(freeze_roles=["vision"]), ROLES, "flow_vla")
    with pytest.raises(ValueError, match=r"'optimizer.freeze_roles': 'visoin' is not a parameter"):
        check_roles(OptimizerConfig(freeze_roles=["visoin"]), ROLES, "flow_vla")
    bad_group = OptimizerConfig(groups=[LRGroupConfig("v", roles=["eyes"])])
    with pytest.raises(ValueError, match=r"'optimizer.groups.v.roles': 'eyes'"):
        check_roles(bad_group, ROLES, "flow_vla")
    everything = OptimizerConfig(freeze_roles=["vision", "backbone"], train_action_expert_only=True)
    everything.freeze_roles.append("action_expert")
    with pytest.raises(ValueError, match="freezes every role of 'flow_vla'.*nothing would train"):
        check_roles(everything, ROLES, "flow_vla")
    with pytest.raises(ValueError, match="no 'action_expert' role"):
        check_roles(OptimizerConfig(groups=[], train_action_expert_only=True), ("trunk",), "toy")


@pytest.mark.parametrize("kind", ["constant", "cosine"])
def test_schedule_warms_up_then_decays_to_min(kind):
    cfg = SchedulerConfig(type=kind, warmup_steps=10, min_lr_ratio=0.1)
    factors = [lr_factor(s, 100, cfg) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    if kind == "constant":
        assert set(factors[10:]) == {1.0}
    else:
        assert factors[10] == pytest.approx(1.0)
        assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
        assert lr_factor(100, 100, cfg) == pytest.approx(0.1)


def test_scheduler_scales_every_group_by_the_same_factor(model):
    cfg = OptimizerConfig()
    groups = resolve_groups(model, cfg)
    groups[0].lr = 1e-2
    optimizer = build_optimizer(model, groups, cfg)
    scheduler = build_scheduler(optimizer, 100, SchedulerConfig(warmup_steps=4))
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert lrs[0] == pytest.approx(1e-2 * 3 / 4) and lrs[1] == pytest.approx(1e-3 * 3 / 4)
