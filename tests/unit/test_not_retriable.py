"""Errors a retry cannot fix end the run at once; everything else keeps Ray's retry budget."""

from __future__ import annotations

import pickle

import ray.exceptions
from ray.train import FailureConfig
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2.api.exceptions import WorkerGroupError

from raytrain_vla.config import ConfigError
from raytrain_vla.data.formats.lerobot_common import DatasetError
from raytrain_vla.errors import RunCannotContinue, as_not_retriable
from raytrain_vla.train.failure_policy import FailFastOnNotRetriable
from raytrain_vla.train.resume import CheckpointDamaged
from raytrain_vla.train.step import TrainingDiverged


def _policy(max_failures: int = 3) -> FailFastOnNotRetriable:
    return FailFastOnNotRetriable(DefaultFailurePolicy(FailureConfig(max_failures=max_failures)))


def _group_error(**failures: Exception) -> WorkerGroupError:
    return WorkerGroupError("boom", {int(k[1:]): v for k, v in failures.items()})


def test_a_not_retriable_worker_error_is_raised_at_once():
    for error in (
        DatasetError("data/chunk-000/file-000.parquet: unreadable"),
        ConfigError("bad value"),
        CheckpointDamaged("no complete checkpoint"),
        TrainingDiverged("20 updates skipped"),
        RunCannotContinue("VideoDecodeError: ..."),
    ):
        # the other rank's collateral error does not make it retriable
        failed = _group_error(r0=RuntimeError("gloo: connection closed"), r1=error)
        assert _policy().make_decision(failed) == FailureDecision.RAISE, error


def test_other_worker_errors_keep_rays_retry_budget():
    policy = _policy(max_failures=2)
    failed = _group_error(r0=RuntimeError("worker died"))
    decisions = [policy.make_decision(failed) for _ in range(3)]
    assert decisions == [FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]


def test_the_policy_survives_the_trip_to_the_controller():
    policy = pickle.loads(pickle.dumps(_policy()))
    assert policy.failure_config.max_failures == 3
    assert policy.make_decision(_group_error(r0=DatasetError("x"))) == FailureDecision.RAISE


def test_a_data_error_inside_a_ray_task_error_is_reraised_with_its_message():
    inner = DatasetError("videos/x.mp4: truncated; episode 4")
    task_error = ray.exceptions.RayTaskError("read_fn", "traceback text", inner)
    wrapped = as_not_retriable(task_error)
    assert isinstance(wrapped, RunCannotContinue)
    assert "DatasetError: videos/x.mp4: truncated; episode 4" in str(wrapped)
    chained = RuntimeError("iterator failed")
    chained.__cause__ = inner
    assert isinstance(as_not_retriable(chained), RunCannotContinue)
    plain = RuntimeError("worker died")
    assert as_not_retriable(plain) is plain and as_not_retriable(inner) is inner
