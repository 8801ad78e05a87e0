"""The GPU check script, run on CPU (`--dry-run`: gloo, tiny model, a few steps) so it cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_gpu_check_dry_run_reports_every_figure(ray_cluster, tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "RAY_ADDRESS": ray_cluster.address,
    }
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    check = report["grad_check"]
    assert check["backend"] == "gloo" and check["world_size"] == 2 and check["ok"], check
    assert report["flops_per_sample"] > 0 and report["micro_batch"] == 8
    for path in ("plain", "ray"):
        assert report[path]["samples_per_s"] > 0 and report[path]["tflops_per_s"] > 0
        assert report[path]["mfu"] is None  # no peak is known for a CPU
    assert 0 <= report["ray"]["data_wait_share"] <= 1
    assert report["ray_over_plain"] > 0
