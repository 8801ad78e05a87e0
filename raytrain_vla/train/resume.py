"""Resume rules, checked on the driver before Ray Train writes anything into the run directory.

A run directory is resumed when its latest registered checkpoint was made with the same recipe
(every config key outside `RESUMABLE_KEYS`) and the same dataset fingerprint. Otherwise the
resume is refused with each differing key and its old and new value.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from raytrain_vla.common.run_storage import (
    RunPath,
    create_exclusive,
    is_remote,
    remove_tree,
    run_path,
    subdirectories,
    tree_modified_at,
)
from raytrain_vla.config import Config, recipe_hash, to_dict
from raytrain_vla.config.recipe import recipe_differences
from raytrain_vla.data.plan import PLAN_VERSION
from raytrain_vla.errors import NotRetriable
from raytrain_vla.train.checkpoint import CONFIG
from raytrain_vla.train.driver_lock import lock_taken_at
from raytrain_vla.train.manifest import checkpoint_problems
from raytrain_vla.train.train_state import TrainState, read_train_state

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of registered checkpoints
CLAIM = ".run_claimed"  # on an object store: the object that reserves a fresh run name


class ResumeRefused(NotRetriable, ValueError):
    """The run directory holds a checkpoint of a different recipe or dataset."""


def read_snapshot(run_dir: RunPath) -> dict | None:
    """Ray Train's snapshot of the run's registered checkpoints; None when there is none.

    An unreadable one is an error naming the file: treating it as absent would start the run
    over and let the prune below delete every checkpoint.
    """
    snapshot = run_dir / SNAPSHOT
    if not snapshot.is_file():
        return None
    try:
        data = json.loads(snapshot.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResumeRefused(
            f"{snapshot}: unreadable ({' '.join(str(err).split())}); it records the run's "
            "checkpoints, so the run will not start without it (restore it from a backup, or "
            "move the run directory aside and start again)"
        ) from err
    if not isinstance(data, dict):
        raise ResumeRefused(f"{snapshot}: expected a JSON object, got {type(data).__name__}")
    return data


def checkpoint_dirs(run_dir: RunPath) -> list[RunPath]:
    """Checkpoint directories in storage, oldest first (Ray names them by their timestamp)."""
    return subdirectories(run_dir, "checkpoint_")


class CheckpointDamaged(NotRetriable, ValueError):
    """No registered checkpoint of the run is complete."""


def registered_checkpoints(run_dir: RunPath) -> list[str]:
    """Names of the checkpoints Ray Train registered and keeps, as its snapshot lists them."""
    snapshot = read_snapshot(run_dir) or {}
    return [r["checkpoint_dir_name"] for r in snapshot.get("checkpoint_results", [])]


def resume_candidates(run_dir: RunPath, latest: RunPath) -> list[RunPath]:
    """`latest`, then the registered checkpoints before it, newest first: where a resume falls
    back to when the latest is damaged."""
    older = sorted((n for n in registered_checkpoints(run_dir) if n < latest.name), reverse=True)
    return [latest, *(run_dir / n for n in older)]


def latest_checkpoint(run_dir: RunPath | str) -> RunPath | None:
    """The checkpoint Ray Train would resume from, or None for a new run."""
    run_dir = run_path(run_dir) if is_remote(run_dir) else run_dir
    latest = (read_snapshot(run_dir) or {}).get("latest_checkpoint_result")
    if not latest:
        return None
    return run_dir / latest["checkpoint_dir_name"]


def prune_untracked_checkpoints(run_dir: RunPath) -> list[str]:
    """Delete checkpoint directories Ray Train never registered; return their names.

    A worker can upload a checkpoint and die before the controller records it (the controller
    polls ranks every few seconds). Ray then resumes from the previous recorded one, and
    retention (`num_to_keep`) never sees the upload, so without this every such failure would
    leak a full model-and-optimizer copy. Call only when no attempt is writing: at loop start.

    Only what is proven this run's and unregistered is deleted: with a readable snapshot, what
    it does not list and is newer than its latest registered checkpoint; without one (Ray
    writes none before the first registration), what appeared since this driver took the run's
    lock (the driver refuses to start over unregistered checkpoints, so those are its own
    attempts' uploads). With neither, nothing is: the checkpoints may be the run's only copy.
    """
    try:
        snapshot = read_snapshot(run_dir)
    except ResumeRefused:
        return []
    if snapshot is None:
        since = lock_taken_at(run_dir)
        if since is None:
            return []
        doomed = [p for p in checkpoint_dirs(run_dir) if tree_modified_at(p) >= since]
    else:
        tracked = {r["checkpoint_dir_name"] for r in snapshot.get("checkpoint_results", [])}
        newest_tracked = max(tracked, default="")
        doomed = [
            p for p in checkpoint_dirs(run_dir) if p.name not in tracked and p.name > newest_tracked
        ]
    for path in doomed:
        remove_tree(path)
    return [p.name for p in doomed]


def recipe_problems(ckpt: RunPath, config_hash: str, cfg: Config) -> list[str]:
    """How the checkpoint's recipe differs from `cfg`'s: nothing when the hashes agree, else
    key by key against its config.yaml (a hash of an older version, which also covered other
    families' options, may differ where no recipe key does)."""
    if config_hash == recipe_hash(cfg):
        return []
    old = yaml.safe_load((ckpt / CONFIG).read_text())
    return recipe_differences(old, to_dict(cfg))


def check_resume(cfg: Config, run_dir: RunPath, dataset_fingerprint: str) -> RunPath | None:
    """Raise ResumeRefused when the latest checkpoint is not this recipe on this dataset, or
    when checkpoints lie there that no snapshot records (a new run would delete them)."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        orphans = checkpoint_dirs(run_dir)
        if orphans and read_snapshot(run_dir) is None:
            raise ResumeRefused(
                f"{run_dir}: refusing to start run '{cfg.ray.run_name}': {len(orphans)} "
                f"checkpoint directories but no {SNAPSHOT} (Ray Train's record of them), and a "
                "new run there would delete them. Keep the weights with `python -m "
                f"raytrain_vla.export {orphans[-1]} OUT` and continue from them with "
                "--model.init_from=OUT under another --ray.run_name (or --ray.resume=never); "
                "delete the directories yourself if they are incomplete uploads"
            )
        return None
    ckpt, state = _newest_sound(run_dir, ckpt)
    problems = []
    if state.step > cfg.train.steps:
        problems.append(
            f"train.steps is {cfg.train.steps} but the checkpoint is at step {state.step} "
            f"(set --train.steps={state.step} or more)"
        )
    problems += recipe_problems(ckpt, state.config_hash, cfg)
    if state.dataset_fingerprint != dataset_fingerprint:
        problems.append(
            f"dataset fingerprint: {state.dataset_fingerprint!r} -> {dataset_fingerprint!r}"
        )
    if state.sample_plan != PLAN_VERSION:
        problems.append(
            f"sample plan: version {state.sample_plan} -> {PLAN_VERSION} (this version draws "
            "another sample order, so resuming would repeat and skip samples; continue from the "
            f"weights with `python -m raytrain_vla.export {ckpt} OUT` and --model.init_from=OUT)"
        )
    if problems:
        raise ResumeRefused(
            f"{run_dir}: refusing to resume run '{cfg.ray.run_name}' at step {state.step}: "
            + "; ".join(problems)
            + " (use another --ray.run_name, or --ray.resume=never to start a new run)"
        )
    return ckpt


def _newest_sound(run_dir: RunPath, latest: RunPath) -> tuple[RunPath, TrainState]:
    """The checkpoint a resume will load: `latest`, else the newest registered one before it
    whose train state reads and whose file sizes match its manifest (the workers then verify
    checksums too, and say which file was bad)."""
    first_problem = ""
    for candidate in resume_candidates(run_dir, latest):
        problems = checkpoint_problems(candidate, checksums=False)
        if not problems:
            try:
                return candidate, read_train_state(candidate)
            except ValueError as err:
                problems = [str(err)]
        first_problem = first_problem or problems[0]
    raise CheckpointDamaged(
        f"{run_dir}: no complete checkpoint to resume from ({first_problem}); start a new run "
        "with --ray.resume=never"
    )


def fresh_run_name(storage: RunPath | str, name: str) -> str:
    """`name` if unused, else `name-YYYYmmdd-HHMMSS[-n]`, claimed by creating its directory: an
    existing run is never overwritten, and two drivers starting in the same second get two
    names (mkdir is atomic where a check-then-create is not). An object store has no
    directories: there a name is claimed by creating its `CLAIM` object exclusively, and one
    with objects under it already counts as used."""
    if is_remote(storage):
        return _fresh_remote_run_name(run_path(storage), name)
    storage = Path(storage)
    storage.mkdir(parents=True, exist_ok=True)
    for candidate in _candidate_names(name):
        try:
            (storage / candidate).mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable: the candidates never run out")


def _candidate_names(name: str) -> Iterator[str]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    yield from (name, f"{name}-{stamp}")
    yield from (f"{name}-{stamp}-{n}" for n in itertools.count(2))


def _fresh_remote_run_name(storage: RunPath, name: str) -> str:
    for candidate in _candidate_names(name):
        run_dir = storage / candidate
        if run_dir.exists():  # a run (of any age) is there; a racing claim fails below
            continue
        if create_exclusive(run_dir / CLAIM, time.strftime("%Y-%m-%d %H:%M:%S %Z").encode()):
            return candidate
    raise AssertionError("unreachable: the candidates never run out")
