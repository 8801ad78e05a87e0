"""A sweep's scheduler after a driver restart decides what it would have decided without one."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyarrow import fs as pafs
from ray.air.constants import EXPR_RESULT_FILE
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from raytrain_vla.config import load_config
from raytrain_vla.tuning.schedulers import build_scheduler, recorded_results
from raytrain_vla.tuning.space import load_space

METRIC = "val_action_mse"


@dataclass
class Storage:
    storage_filesystem: pafs.FileSystem = field(default_factory=pafs.LocalFileSystem)
    trial_dir_name: str | None = "restored"


@dataclass(eq=False)
class RecordedTrial:
    """What a scheduler and `recorded_results` read of a Tune trial (hashable by identity,
    as the median rule keys its history by trial)."""

    trial_id: str
    path: str
    local_path: str | None = None
    status: str = Trial.PENDING
    storage: Storage = field(default_factory=Storage)


class Controller:
    """The one thing the median rule asks of Tune's controller."""

    def get_live_trials(self) -> list:
        return []


TUNE = Controller()


def space_with(tmp_path: Path, scheduler: str):
    path = tmp_path / "space.yaml"
    path.write_text(
        textwrap.dedent(f"""
        metric: {METRIC}
        mode: min
        scheduler: {scheduler}
        params:
          optimizer.groups.vision.lr: {{loguniform: [1.0e-5, 1.0e-3]}}
        """)
    )
    base = load_config()
    base.train.steps = 30
    return load_space(path, base), base


def fresh(space, base):
    scheduler = build_scheduler(space, base)
    scheduler.set_search_properties(METRIC, "min")
    return scheduler


def result(step: int, mse: float) -> dict:
    return {"step": step, METRIC: mse, "training_iteration": step // 10}


def finished_trial(tmp_path: Path, name: str, results: list[dict]) -> RecordedTrial:
    """A trial the first driver ran to the end, its results in run storage's `result.json`."""
    trial_dir = tmp_path / "storage" / name
    trial_dir.mkdir(parents=True)
    (trial_dir / EXPR_RESULT_FILE).write_text("".join(json.dumps(r) + "\n" for r in results))
    return RecordedTrial(name, str(trial_dir), status=Trial.TERMINATED)


GOOD_RUN = [result(10, 0.5), result(20, 0.3), result(30, 0.2)]


@pytest.mark.parametrize(
    "scheduler",
    [
        "{type: asha, grace_period: 10, reduction_factor: 2}",
        "{type: median, grace_period: 10, min_samples_required: 1}",
    ],
)
def test_a_restored_scheduler_stops_the_trial_the_first_driver_would_have(tmp_path, scheduler):
    space, base = space_with(tmp_path, scheduler)
    bad = RecordedTrial("bad", str(tmp_path / "storage" / "bad"))

    # The first driver saw the good trial to the end, then stopped the bad one at step 10.
    first = fresh(space, base)
    good = RecordedTrial("good", str(tmp_path / "storage" / "good"))
    first.on_trial_add(TUNE, good)
    for r in GOOD_RUN:
        assert first.on_trial_result(TUNE, good, r) == TrialScheduler.CONTINUE
    first.on_trial_complete(TUNE, good, GOOD_RUN[-1])
    first.on_trial_add(TUNE, bad)
    assert first.on_trial_result(TUNE, bad, result(10, 0.9)) == TrialScheduler.STOP

    # A restarted driver: the same trials restored, the scheduler built anew.
    restored = fresh(space, base)
    restored.on_trial_add(TUNE, finished_trial(tmp_path, "good", GOOD_RUN))
    restored.on_trial_add(TUNE, bad)
    assert restored.on_trial_result(TUNE, bad, result(10, 0.9)) == TrialScheduler.STOP


def test_a_new_trial_starts_with_an_empty_history(tmp_path):
    space, base = space_with(tmp_path, "{type: asha, grace_period: 10, reduction_factor: 2}")
    restored = fresh(space, base)
    first_trial = RecordedTrial("first", "unnamed yet", storage=Storage(trial_dir_name=None))
    restored.on_trial_add(TUNE, first_trial)
    # Nothing to compare with: the first trial to reach a rung continues.
    assert restored.on_trial_result(TUNE, first_trial, result(10, 0.9)) == TrialScheduler.CONTINUE


def test_recorded_results_reads_the_longer_copy_and_stops_at_a_cut_line(tmp_path):
    trial = finished_trial(tmp_path, "t", GOOD_RUN[:1])  # storage lags one sync behind
    local = tmp_path / "staging" / "t"
    local.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in GOOD_RUN)
    (local / EXPR_RESULT_FILE).write_text(lines + '{"step": 4')  # the kill cut the last line
    trial.local_path = str(local)
    assert recorded_results(trial) == GOOD_RUN
