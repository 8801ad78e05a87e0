"""The sample order is a function of the plan, not of the number of workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain_vla import run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _global_batches(run_dir: Path) -> dict[int, list[int]]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    out: dict[int, list[int]] = {}
    for row in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        out.setdefault(row["step"], []).extend(row["ids"])
    return out


def test_one_and_two_workers_read_the_same_global_batches(run_args, tmp_path):
    debug = "--debug.log_sample_ids=true"
    assert run.main(run_args("w2", 5, debug, "--ray.num_workers=2")) == 0
    # One worker keeps the global batch of 16 with two accumulation steps of 8.
    assert run.main(run_args("w1", 5, debug, "--ray.num_workers=1")) == 0
    w1, w2 = _global_batches(tmp_path / "runs" / "w1"), _global_batches(tmp_path / "runs" / "w2")
    assert sorted(w1) == list(range(5))
    assert w1 == w2
    rows = [
        json.loads(line)
        for line in (tmp_path / "runs" / "w1" / "samples.jsonl").read_text().splitlines()
    ]
    assert {r["world_size"] for r in rows} == {1} and all(len(r["ids"]) == 16 for r in rows)
