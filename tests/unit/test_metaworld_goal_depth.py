"""benchmarks/metaworld_goal_depth.py measures what it says: push's goals lie on the table, so
one pixel never hides two of them; reach's float, so one pixel does; every reset frame draws
the marker away from the new goal. Physics only (no render), a few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import fixtures_root

pytest.importorskip("metaworld")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "metaworld_goal_depth.py"


def test_goal_depth_report():
    dataset = fixtures_root() / "lerobot_v3" / "pusht_like"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "reach,push", "--resets", "300",
         "--dataset", str(dataset)],
        capture_output=True, text=True, check=True, env={**os.environ, "MUJOCO_GL": "egl"},
    )  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    reach, push = report["tasks"]["reach-v3"], report["tasks"]["push-v3"]
    assert push["share_a_pixel_far_apart"] == 0.0 and push["ceiling_from_the_pixel"] == 1.0
    assert reach["share_a_pixel_far_apart"] > 0.0
    assert reach["ceiling_from_the_pixel"] < 1.0
    assert reach["reset_marker_stale"] == push["reset_marker_stale"] == 1.0
    per_task = report["actions"]["per_task"]
    assert sum(t["frames"] for t in per_task.values()) == 120  # the fixture's frames
    assert all(0.0 <= t["beyond_1"] <= 1.0 for t in per_task.values())
