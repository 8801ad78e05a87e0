"""The update guard of `StepRunner`, on a two-parameter model in one process (no Ray)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raytrain_vla.train.optim import ParamGroup
from raytrain_vla.train.step import StepRunner, TrainingDiverged


class Line(nn.Module):
    """loss = (w * x + b - y)^2 per sample; `poison` makes the gradient of `w` non-finite."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))
        self.b = nn.Parameter(torch.tensor(0.0))
        self.poison = False
        self.w.register_hook(lambda g: g * float("nan") if self.poison else g)

    def compute_loss(self, batch: dict, noise: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return (self.w * batch["x"] + self.b - batch["y"]).square()


def runner(model: Line, limit: int) -> StepRunner:
    optimizer = torch.optim.SGD([{"params": list(model.parameters()), "name": "all"}], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    groups = [ParamGroup("all", ["w", "b"], 0.1, 0.0)]
    return StepRunner(
        model, optimizer, scheduler, groups, lambda step, ids: (torch.zeros(len(ids)),) * 2,
        grad_clip=1.0, max_consecutive_skipped=limit,
    )  # fmt: skip


def batch() -> list[dict]:
    x = torch.tensor([1.0, 2.0, 3.0])
    return [{"x": x, "y": 2 * x, "sample_ids": torch.arange(3), "actions": x[:, None]}]


def test_a_non_finite_gradient_skips_the_update_and_keeps_the_weights():
    model = Line()
    steps = runner(model, limit=3)
    assert steps.run(0, batch())["update_skipped"] == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    model.poison = True
    metrics = steps.run(1, batch())
    assert metrics["update_skipped"] == 1.0 and metrics["loss"] > 0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    model.poison = False  # an applied update resets the count
    assert steps.run(2, batch())["update_skipped"] == 0.0 and steps.skipped_in_a_row == 0


def test_too_many_skipped_updates_in_a_row_stop_the_run_naming_the_step_and_last_loss():
    model = Line()
    steps = runner(model, limit=3)
    applied = steps.run(0, batch())["loss"]
    model.poison = True
    steps.run(1, batch())
    steps.run(2, batch())
    with pytest.raises(TrainingDiverged) as err:
        steps.run(3, batch())
    message = str(err.value)
    assert message.startswith("step 3: 3 updates in a row skipped for non-finite gradients")
    assert f"last applied update was step 0 at loss {applied:.6g}" in message
    assert "train.max_consecutive_skipped_updates=3" in message
