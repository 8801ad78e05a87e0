"""`--optimizer.type=muon` on Ray: the same losses on 1 and 2 workers, different from AdamW's,
Muon's own metrics, a worker killed mid-run resumes bitwise (Muon's momentum is in the DCP
checkpoint), and a 2-worker checkpoint goes on alike on 1 worker (it reshards)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_faults import DEBUG, assert_same_weights, committed_ids, losses

from raytrain_vla import run

pytestmark = pytest.mark.usefixtures("ray_cluster")
STEPS = 8  # checkpoints at 3, 6 and 8
MUON = ("--optimizer.type=muon", "--optimizer.groups=[]", "--optimizer.lr=0.02")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_muon_trains_alike_on_one_and_two_workers_and_resumes_bitwise(run_args, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert run.main(run_args("muon2", STEPS, DEBUG, *MUON, "--ray.num_workers=2")) == 0
    assert "note: optimizer muon: adamw: " in capsys.readouterr().out  # before Ray: each way
    killed = run_args(
        "muon2_killed", STEPS, DEBUG, *MUON, "--ray.num_workers=2", "--ray.max_failures=1",
        "--debug.kill_at_step=6", "--debug.kill_rank=1",
    )  # fmt: skip
    assert run.main(killed) == 0
    assert (runs / "muon2_killed" / ".fault_kill_6").exists()
    assert committed_ids(runs / "muon2_killed") == committed_ids(runs / "muon2")
    assert losses(runs / "muon2_killed") == losses(runs / "muon2")
    assert_same_weights(runs / "muon2_killed", runs / "muon2")

    assert run.main(run_args("muon1", STEPS, *MUON, "--ray.num_workers=1")) == 0
    lr = ("--optimizer.groups=[]", "--optimizer.lr=0.02")
    assert run.main(run_args("adamw2", STEPS, *lr, "--ray.num_workers=2")) == 0
    two, one, adamw = (
        np.array(list(losses(runs / name).values())) for name in ("muon2", "muon1", "adamw2")
    )
    assert len(two) == STEPS
    np.testing.assert_allclose(one, two, rtol=2e-3)  # W=1 vs W=2: summation order only
    assert np.abs(adamw[2:] / two[2:] - 1).max() > 0.01  # a different optimizer

    # Both 2-worker runs ended at step 8 in the same state. Going on to step 10, one resumes on
    # 1 worker (DCP reshards Muon's momentum as it does AdamW's state), the other on 2.
    assert run.main(run_args("muon2", 10, *MUON, "--ray.num_workers=1")) == 0
    assert run.main(run_args("muon2_killed", 10, *MUON, "--ray.num_workers=2")) == 0
    resumed_on_one, resumed_on_two = (losses(runs / n) for n in ("muon2", "muon2_killed"))
    np.testing.assert_allclose(
        [resumed_on_one[s] for s in (9, 10)], [resumed_on_two[s] for s in (9, 10)], rtol=2e-3
    )

    train = [r for r in _records(runs / "muon2") if r["kind"] == "train" and r["step"] <= STEPS]
    assert all(r["muon/update_rms/default/muon"] > 0 for r in train)
    assert all(0 < r["clip_coef"] <= 1 for r in train)
    assert all(r["comm/muon_bytes"] > 0 for r in train)  # gathered and scattered shards
    assert "lr/default/muon" in train[0] and "lr/default" in train[0]
