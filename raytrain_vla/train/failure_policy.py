"""Ray Train's failure policy, with one rule added: a `NotRetriable` worker error ends the run.

Ray Train (V2) builds its `DefaultFailurePolicy` inside `DataParallelTrainer.fit` and offers no
public way to classify errors, so `Trainer` wraps the policy where fit hands it to the
controller. Everything else (worker deaths, preemptions, controller errors, the retry counts)
is decided by Ray's own policy, unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.torch import TorchTrainer

from raytrain_vla.errors import not_retriable_cause

logger = logging.getLogger(__name__)

try:  # Ray Train V2 (the default since Ray 2.50)
    from ray.train.v2._internal.execution.failure_handling import FailureDecision, FailurePolicy
    from ray.train.v2.api.exceptions import WorkerGroupError
except ImportError:  # pragma: no cover - V1 has no failure policy to wrap
    FailurePolicy = object
    FailureDecision = WorkerGroupError = None


def not_retriable_worker_error(error: BaseException) -> BaseException | None:
    """The `NotRetriable` error one of the failed workers raised, if any."""
    failures = getattr(error, "worker_failures", None) or {}
    for rank in sorted(failures):
        cause = not_retriable_cause(failures[rank])
        if cause is not None:
            return cause
    return None


class FailFastOnNotRetriable(FailurePolicy):
    """Raise at once when a worker failed with a `NotRetriable` error; else ask Ray's policy."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.failure_config = inner.failure_config

    def make_decision(self, training_failed_error, *args, **kwargs):
        if isinstance(training_failed_error, WorkerGroupError):
            cause = not_retriable_worker_error(training_failed_error)
            if cause is not None:
                logger.warning(
                    "not retrying: a worker raised %s, which every retry would raise again: %s",
                    type(cause).__name__,
                    cause,
                )
                return FailureDecision.RAISE
        return self.inner.make_decision(training_failed_error, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # any other hook Ray's policy has
        if name == "inner" or name.startswith("__"):  # unpickling: `inner` is not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)


class Trainer(TorchTrainer):
    """TorchTrainer whose controller does not retry errors a retry cannot fix."""

    def _initialize_and_run_controller(self, **kwargs):
        policy = kwargs.get("failure_policy")
        if policy is not None and FailureDecision is not None:
            kwargs["failure_policy"] = FailFastOnNotRetriable(policy)
        return super()._initialize_and_run_controller(**kwargs)
