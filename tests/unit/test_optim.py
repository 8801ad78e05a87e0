"""LR groups, freezing and the schedule: plain torch, no Ray."""

import pytest
import torch

from raytrain_vla.config.schema import LRGroupConfig, OptimizerConfig, SchedulerConfig
from raytrain_vla.models.registry import build_model
from raytrain_vla.train.optim import (
    build_optimizer,
    build_scheduler,
    freeze_for_config,
    lr_factor,
    resolve_groups,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("flow_vla", {"size": "tiny"})


def test_default_groups_hold_exactly_their_tower(model):
    groups = {
        g.name: set(g.param_names)
        for g in resolve_groups(model.named_parameters(), OptimizerConfig())
    }
    names = {n for n, _ in model.named_parameters()}
    for tower in ("vision", "backbone", "action_expert"):
        assert groups[tower] == {n for n in names if n.startswith(tower + ".")}
    assert "default" not in groups  # the three towers cover every parameter


def test_first_match_wins_and_leftovers_go_to_default(model):
    cfg = OptimizerConfig(
        lr=0.5,
        groups=[
            LRGroupConfig("film", [r"\.films\."], 1e-2, 0.0),
            LRGroupConfig("vision", [r"^vision\."], 1e-3, 0.1),
        ],
    )
    groups = {g.name: g for g in resolve_groups(model.named_parameters(), cfg)}
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
    with pytest.raises(ValueError, match=r"\['typo'\] match no trainable parameter"):
        resolve_groups(model.named_parameters(), cfg)


def test_train_action_expert_only_freezes_the_rest():
    torch.manual_seed(0)
    m = build_model("flow_vla", {"size": "tiny"})
    cfg = OptimizerConfig(train_action_expert_only=True)
    frozen = freeze_for_config(m, cfg)
    assert frozen and all(not n.startswith("action_expert.") for n in frozen)
    groups = resolve_groups(m.named_parameters(), cfg)
    assert [g.name for g in groups] == ["action_expert"]


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
    groups = resolve_groups(model.named_parameters(), cfg)
    groups[0].lr = 1e-2
    optimizer = build_optimizer(model, groups, cfg)
    scheduler = build_scheduler(optimizer, 100, SchedulerConfig(warmup_steps=4))
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert lrs[0] == pytest.approx(1e-2 * 3 / 4) and lrs[1] == pytest.approx(1e-3 * 3 / 4)
