"""Trial schedulers that keep their decisions across a sweep driver restart.

Tune does not save a scheduler's state with the experiment (`TuneController.__getstate__`
drops it), so a restored sweep would start ASHA's rungs, or the median rule's history, empty:
a bad trial after the restart runs to the end instead of being stopped where it would have
been. Every result Tune passed to the scheduler is also in the trial's `result.json`, so a
restored scheduler is fed each restored trial's recorded results again, in order, through the
scheduler's own public callbacks.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyarrow import fs as pafs
from ray.air.constants import EXPR_RESULT_FILE
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

from raytrain_vla.config import Config
from raytrain_vla.tuning.space import Space


def recorded_results(trial: Trial) -> list[dict]:
    """The results Tune logged for `trial`: its run storage copy or the driver's local one,
    whichever holds more (the storage copy lags the local one by up to one sync)."""
    if not trial.storage.trial_dir_name:
        return []  # a new trial: Tune names its directory after adding it
    copies = [_read_lines(trial.storage.storage_filesystem, f"{trial.path}/{EXPR_RESULT_FILE}")]
    if trial.local_path:
        copies.append(
            _read_lines(pafs.LocalFileSystem(), str(Path(trial.local_path, EXPR_RESULT_FILE)))
        )
    lines = max(copies, key=len)
    results = []
    for line in lines:
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by the kill that stopped the previous driver
    return results


def _read_lines(filesystem: pafs.FileSystem, path: str) -> list[str]:
    try:
        with filesystem.open_input_stream(path) as stream:
            return stream.readall().decode().splitlines()
    except OSError:  # not written yet, or not there at all
        return []


class ReplaysRecordedResults:
    """Mixin for a Tune scheduler: a trial added with results already recorded (a restored
    sweep) has them replayed, so rungs and medians are what they were before the restart."""

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        results = recorded_results(trial)
        for result in results:
            super().on_trial_result(tune_controller, trial, result)  # decisions already taken
        if results and trial.status == Trial.TERMINATED:
            super().on_trial_complete(tune_controller, trial, results[-1])


class RestorableASHAScheduler(ReplaysRecordedResults, ASHAScheduler):
    """ASHA whose rungs survive a sweep driver restart."""


class RestorableMedianStoppingRule(ReplaysRecordedResults, MedianStoppingRule):
    """The median stopping rule with its trial history surviving a sweep driver restart."""


def build_scheduler(space: Space, cfg: Config) -> TrialScheduler:
    """The space's `scheduler:` block as a Tune scheduler on the trial's `step`."""
    spec = space.scheduler
    grace = spec.grace_period or cfg.train.val_interval
    if spec.type == "asha":
        # One past the last step: at max_t ASHA stops a trial at its final report, and Tune's
        # stop raced the trial's own end (the export after that report went missing in CI).
        return RestorableASHAScheduler(
            time_attr="step",
            max_t=cfg.train.steps + 1,
            grace_period=grace,
            reduction_factor=spec.reduction_factor,
        )
    if spec.type == "median":
        return RestorableMedianStoppingRule(
            time_attr="step",
            grace_period=grace,
            min_samples_required=spec.min_samples_required,
        )
    return FIFOScheduler()
