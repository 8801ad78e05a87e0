"""Elastic training on a simulated multi-node cluster: shrink on node loss, grow back, same data.

The session head node has no `trainer` resource, so the elastic run's workers (which ask for
one each) land only on the single-CPU nodes this test adds and removes. Ray Data's read tasks
run on the head. Steps are paced (`debug.step_delay_s`, no effect on the math) so the run is
still going when Ray notices each change.

Elastic sizing reads the nodes from a view that refreshes on a 20 s tick. Left alone, Ray
needed about 30 s to shrink (it retried the old size until the tick) and about 20 s to grow.
After each node change the test runs that tick at once (`refresh_elastic_view_of_nodes`), as
the next tick would: the sizes Ray chooses are the same, found sooner.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from _runs import short_run_args
from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
    get_or_create_autoscaling_coordinator,
)
from ray.experimental.internal_kv import _internal_kv_get
from safetensors.numpy import load_file

from raytrain_vla import run
from raytrain_vla.train.resume import SNAPSHOT

STEPS = 80
SAVE_INTERVAL = 10  # each checkpoint costs ~1.5 s here; a resize redoes at most this many steps
TRAINER_NODE = {"num_cpus": 1, "resources": {"trainer": 1}}
ELASTIC = (
    "--ray.num_workers=[1,2]",
    '--ray.resources_per_worker={"CPU": 1, "trainer": 1}',
    "--ray.elastic_resize_monitor_interval_s=2",
    "--ray.max_failures=4",
    "--debug.step_delay_s=0.25",
)
COMMON = ("--debug.log_sample_ids=true", f"--train.save_interval={SAVE_INTERVAL}")
# W=2 -> 1 -> 2 against W=2 throughout. Float reduction order differs while W=1 (two
# accumulated micro-batches instead of an all-reduce of two), and Adam carries those last-bit
# differences forward. Measured after 120 steps over two runs: final loss 1e-7 and 1e-3
# relative, weights 2e-5 and 7e-4 relative (L2 over all parameters); after 80 steps: 7e-8 and
# 1.8e-5. A wrong batch or a lost optimizer state moves both by far more (a different global
# batch changes the loss by ~10%).
LOSS_RTOL = 2e-2
WEIGHTS_RTOL = 1e-2


def global_batches(run_dir: Path) -> dict[int, tuple[int, list[int]]]:
    """Per step: (world size, sorted ids of every rank) of the last attempt that ran the step."""
    out: dict[int, tuple[int, dict[int, list[int]]]] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        world, ranks = out.get(row["step"], (row["world_size"], {}))
        if world != row["world_size"] or row["rank"] in ranks:
            world, ranks = row["world_size"], {}  # a redo of this step by a later attempt
        ranks[row["rank"]] = row["ids"]
        out[row["step"]] = (world, ranks)
    return {s: (w, sorted(i for ids in r.values() for i in ids)) for s, (w, r) in out.items()}


def sample_rows(run_dir: Path) -> list[dict]:
    """Rows written so far; a last line still being written is left for the next poll."""
    log = run_dir / "samples.jsonl"
    text = log.read_text() if log.exists() else ""
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines()]


def train_losses(run_dir: Path) -> dict[int, float]:
    """Loss per step of the attempt that ran it last (metrics rows are numbered by steps done)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def requested_trainer_bundles() -> int:
    """Bundles with a `trainer` resource in the demand `ray.autoscaler.sdk.request_resources` set.

    That is the channel the autoscaler (v1) reads its explicit resource requests from.
    """
    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    bundles = json.loads(raw) if raw else []
    return sum(1 for b in bundles if b.get("trainer", 0) > 0)


def refresh_elastic_view_of_nodes(trainer_nodes: int) -> None:
    """Make Ray Train's elastic sizing see the trainer nodes the test just added or removed.

    An elastic group is sized from the AutoscalingCoordinator's node view, which refreshes only
    on its 20 s tick. A tick that fell between the two `add_node` calls once started the run at
    1 worker although both nodes were up. Once Ray's resources show `trainer_nodes`,
    `recompute=True` runs a tick now.
    """
    deadline = time.monotonic() + 60
    while ray.cluster_resources().get("trainer", 0) != trainer_nodes:
        assert time.monotonic() < deadline, f"Ray never showed {trainer_nodes} trainer nodes"
        time.sleep(0.2)
    coordinator = get_or_create_autoscaling_coordinator()
    ray.get(coordinator.get_reserved_resources.remote("test_elastic", recompute=True))


def wait_for(predicate, timeout_s: float, what: str, run_thread: threading.Thread) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert run_thread.is_alive(), f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


def test_elastic_run_shrinks_grows_back_and_keeps_the_global_batches(
    ray_cluster, demo_root, tmp_path
):
    storage = tmp_path / "runs"
    fixed_args = short_run_args(demo_root, storage, "fixed", STEPS, *COMMON, "--ray.num_workers=2")
    assert run.main(fixed_args) == 0

    nodes = [ray_cluster.add_node(**TRAINER_NODE) for _ in range(2)]
    # Start at 2 workers only once both nodes' resources are visible, to Ray and to the view
    # elastic sizing reads: either one lagging made the run start at its minimum of 1 in CI.
    ray_cluster.wait_for_nodes()
    refresh_elastic_view_of_nodes(2)
    elastic_args = short_run_args(demo_root, storage, "elastic", STEPS, *COMMON, *ELASTIC)
    result: dict[str, int] = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("rc", run.main(elastic_args)), daemon=True
    )
    thread.start()
    run_dir = storage / "elastic"
    rows = lambda: sample_rows(run_dir)  # noqa: E731
    try:
        wait_for(
            lambda: any(r["world_size"] == 2 and r["step"] >= SAVE_INTERVAL + 1 for r in rows()),
            180,
            "two workers past the first checkpoint",
            thread,
        )
        removed_after = max(r["step"] for r in rows())
        ray_cluster.remove_node(nodes.pop())
        refresh_elastic_view_of_nodes(1)
        wait_for(
            lambda: any(r["world_size"] == 1 for r in rows()), 180, "one worker training", thread
        )
        # Running at the minimum, the job keeps asking the autoscaler for its maximum.
        assert ray.cluster_resources().get("trainer") == 1
        wait_for(
            lambda: requested_trainer_bundles() >= 2, 60, "a request for 2 trainer bundles", thread
        )
        # Grow back only once the one-worker attempt has saved a checkpoint of its own; sooner,
        # the regrown attempt redoes every one-worker step and no W=1 step survives to compare.
        shrunk_from = min(r["step"] for r in rows() if r["world_size"] == 1)
        wait_for(
            lambda: any(
                r["world_size"] == 1 and r["step"] >= shrunk_from + SAVE_INTERVAL + 1
                for r in rows()
            ),
            180,
            "one worker past its first checkpoint",
            thread,
        )
        nodes.append(ray_cluster.add_node(**TRAINER_NODE))
        shrunk_rows = len(rows())
        ray_cluster.wait_for_nodes()
        refresh_elastic_view_of_nodes(2)
        wait_for(
            lambda: any(r["world_size"] == 2 for r in rows()[shrunk_rows:]),
            180,
            "two workers again",
            thread,
        )
        thread.join(timeout=300)
    finally:
        if thread.is_alive():
            pytest.fail("the elastic run did not finish")
        for node in nodes:
            ray_cluster.remove_node(node)
    assert result["rc"] == 0

    # The run went 2 -> 1 -> 2 workers, and the shrunk attempt started from a checkpoint.
    history = [r["world_size"] for r in sample_rows(run_dir)]
    changes = [w for i, w in enumerate(history) if i == 0 or w != history[i - 1]]
    assert changes == [2, 1, 2], changes
    first_shrunk = next(r["step"] for r in sample_rows(run_dir) if r["world_size"] == 1)
    assert first_shrunk % SAVE_INTERVAL == 0 and first_shrunk <= removed_after + 1

    # Every step trained on exactly the fixed-size run's global batch, whatever the world size.
    elastic, fixed = global_batches(run_dir), global_batches(storage / "fixed")
    assert sorted(elastic) == list(range(STEPS))
    assert {w for w, _ in elastic.values()} == {1, 2}
    for step in range(STEPS):
        assert elastic[step][1] == fixed[step][1], f"step {step}"

    # Until the first resize it is the same math on the same world size: bitwise the same.
    losses, fixed_losses = train_losses(run_dir), train_losses(storage / "fixed")
    for done in range(1, first_shrunk + 1):
        assert losses[done] == fixed_losses[done], f"loss after {done} steps"
    np.testing.assert_allclose(losses[STEPS], fixed_losses[STEPS], rtol=LOSS_RTOL)
    a = load_file(str(run_dir / "export" / "model.safetensors"))
    b = load_file(str(storage / "fixed" / "export" / "model.safetensors"))
    diff = np.sqrt(sum(float(np.sum((a[k] - b[k]) ** 2)) for k in b))
    assert diff < WEIGHTS_RTOL * np.sqrt(sum(float(np.sum(b[k] ** 2)) for k in b))

    # Uploads the controller never registered were pruned; retention kept `num_to_keep`.
    tracked = json.loads((run_dir / SNAPSHOT).read_text())["checkpoint_results"]
    on_disk = sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir())
    assert on_disk == sorted(r["checkpoint_dir_name"] for r in tracked)
    assert len(on_disk) == 2
