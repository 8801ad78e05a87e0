"""A driver on a node where Ray already runs joins that cluster (as a bare `ray.init()` would)
and says so; with `ray.local_num_cpus` it starts a private one. Both used to fail with Ray's
"num_cpus and num_gpus must not be provided" when `ray start` had recorded its cluster.

The session's cluster records its address in Ray's node file exactly as `ray start` does, so a
driver started here without RAY_ADDRESS sees it as the cluster running on this node.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ray._private.services import find_bootstrap_address

PROBE = (
    "import sys, ray\n"
    "from raytrain_vla.config import load_config\n"
    "from raytrain_vla.train.launch import init_ray\n"
    "init_ray(load_config(None, sys.argv[1:]))\n"
    "print('GCS', ray.get_runtime_context().gcs_address, ray.cluster_resources()['CPU'])\n"
)


def _driver(*overrides: str) -> tuple[str, float, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *overrides],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, gcs, cpus = next(ln for ln in proc.stdout.splitlines() if ln.startswith("GCS")).split()
    return gcs, float(cpus), proc.stderr


def test_a_driver_joins_the_cluster_running_on_its_node_or_starts_a_private_one(ray_cluster):
    if find_bootstrap_address(None) != ray_cluster.address:
        pytest.skip("another Ray cluster on this machine recorded itself last")
    gcs, cpus, err = _driver()
    assert gcs == ray_cluster.address and cpus == 8.0
    assert "note: joining the Ray cluster `ray start` runs on this node" in err
    gcs, cpus, err = _driver("--ray.local_num_cpus=3")
    assert gcs != ray_cluster.address and cpus == 3.0
    assert "note: starting a private Ray cluster (ray.local_num_cpus is set)" in err
