"""Errors that a retry cannot fix.

Ray Train restarts the worker group up to `ray.max_failures` times after any worker error. That
is right for a lost node or a killed worker, and wrong for bad data, a bad config, a corrupt
checkpoint or a diverged run: the restarted attempt reads the same files and reaches the same
error, after minutes of start-up. Errors of these kinds derive from `NotRetriable`, and the run's
failure policy (`train/failure_policy.py`) ends the run on the first one.
"""

from __future__ import annotations


class NotRetriable(Exception):
    """An error that every retry of the run would raise again."""


class RunCannotContinue(NotRetriable, RuntimeError):
    """What a worker raises for a `NotRetriable` error found inside another (a Ray Data task
    error, say): exception chains do not survive the trip to Ray Train's controller."""


def not_retriable_cause(error: BaseException | None) -> BaseException | None:
    """`error` or the first error in its cause chain (including a Ray task error's `cause`)
    that is `NotRetriable`."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, NotRetriable):
            return error
        seen.add(id(error))
        inner = getattr(error, "cause", None)  # ray.exceptions.RayTaskError
        error = inner if isinstance(inner, BaseException) else error.__cause__ or error.__context__
    return None


def as_not_retriable(error: BaseException) -> BaseException:
    """The error to let reach Ray Train: our own `NotRetriable` error as it is; one wrapped in
    another error re-raised as `RunCannotContinue` with its message; anything else unchanged."""
    cause = not_retriable_cause(error)
    if cause is None or (cause is error and type(error).__module__.startswith("raytrain_vla.")):
        return error
    return RunCannotContinue(f"{type(cause).__name__}: {cause}")
