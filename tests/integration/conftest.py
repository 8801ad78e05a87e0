"""One local Ray cluster for the whole integration session, and a small shared demo dataset."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import ray
from _runs import short_run_args
from ray.cluster_utils import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from s3_server import S3Server  # noqa: E402

from raytrain_vla.data.demo import write_demo_dataset


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server on 127.0.0.1 for the object-store tests. Started before the Ray
    cluster, whose processes then inherit its AWS_* variables as nodes inherit theirs."""
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster(s3_server):
    """A head node with logical CPUs beyond the 2 training workers, so Ray Data never starves.

    It is a `Cluster` so the elastic tests can add and remove nodes; teardown stops only the
    processes this cluster started.
    """
    # Ray Train waits this long for a placement group before retrying at another size; the
    # 60 s default would make a test wait for a node it has just removed. Raylets and the
    # controller inherit this environment.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    # The controller polls its workers this often (default 2 s). A finished run waits up to two
    # polls, one to register its last checkpoint and one to see the workers done: about 3.5 s of
    # each run's ~20 s here. It also notices a killed worker sooner.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    # Each worker group also starts an actor that polls for node-preemption notices; this
    # cluster's nodes are never preempted (the elastic test removes them outright), and the
    # actor's start cost ~2.8 s of CPU per attempt, a tenth of a short run's on 2 cores.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # The dashboard serves the State API, which Ray Train's placement-group cleaner needs to
    # free a trial's workers when Tune stops it early (ASHA); without it they leak.
    # A free port for the dashboard: a dashboard already running on this machine (8265) must
    # not fail the session.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dashboard_port = probe.getsockname()[1]
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 8, "include_dashboard": True, "dashboard_port": dashboard_port
        },
    )  # fmt: skip
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("data") / "demo", num_episodes=60, seed=0)


@pytest.fixture()
def run_args(demo_root, tmp_path):
    """Overrides for a short tiny-model run on the shared dataset, writing under tmp_path."""

    def make(name: str, steps: int, *extra: str) -> list[str]:
        return short_run_args(demo_root, tmp_path / "runs", name, steps, *extra)

    return make
