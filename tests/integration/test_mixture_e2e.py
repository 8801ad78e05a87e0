"""A mixture of the demo dataset and an arm with another action size and other cameras, trained
through the CLI: the same global batches on 1 and 2 workers, a resume that continues the
sequence, the weights realised, per-dataset metrics, and an export that predicts per robot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from _runs import short_run_args

from raytrain_vla import eval as eval_cli
from raytrain_vla import policy, report, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from robot_data import write_arm_dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

ARM_CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (32, 32)}
WEIGHTS = {"demo": 0.7, "arm": 0.3}


def _args(demo_root: Path, arm_root: Path, storage: Path, name: str, steps: int, *extra: str):
    args = short_run_args(demo_root, storage, name, steps, *extra)
    mixture = (
        f"--data.mixture=[{{root: {demo_root}, weight: {WEIGHTS['demo']}, name: demo}}, "
        f"{{root: {arm_root}, weight: {WEIGHTS['arm']}, name: arm}}]"
    )
    rest = [a for a in args if not a.startswith("--data.root=")]
    return [mixture, "--model.flow_vla.max_text_len=112", "--debug.log_sample_ids=true", *rest]


def _global_batches(run_dir: Path) -> dict[int, list[str]]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    out: dict[int, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        out.setdefault(row["step"], []).extend(row["ids"])
    return out


def test_a_mixture_trains_alike_on_any_world_size_resumes_and_exports_per_robot(
    demo_root, tmp_path, capsys
):
    arm = write_arm_dataset(tmp_path / "arm", lengths=(30, 22, 25, 28, 31, 26), cameras=ARM_CAMERAS)
    runs = tmp_path / "runs"
    steps = 6
    args = lambda name, n, *extra: _args(demo_root, arm, runs, name, n, *extra)  # noqa: E731
    val = "--train.val_interval=3"
    # The demo member is scored in closed loop as robot "demo" at the end of the run.
    evals = ("--eval.episodes=2", "--eval.at_validation=false")
    assert run.main(args("w2", steps, "--ray.num_workers=2", val, *evals)) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads(next(ln for ln in lines if ln.startswith("summary: "))[9:])
    assert set(summary["val_mse_ratio_per_dataset"]) == set(WEIGHTS)
    assert all(v > 0 for v in summary["val_mse_ratio_per_dataset"].values())
    # One worker, stopped at the step-3 checkpoint, then resumed to the end.
    assert run.main(args("w1", 3, "--ray.num_workers=1", val)) == 0
    assert run.main(args("w1", steps, "--ray.num_workers=1", val)) == 0
    w1, w2 = _global_batches(runs / "w1"), _global_batches(runs / "w2")
    assert sorted(w2) == list(range(steps))
    assert w1 == w2  # world-size independent, and the resume continued the same sequence
    drawn = [i.split(":")[0] for ids in w2.values() for i in ids]
    assert set(drawn) == set(WEIGHTS)
    n = len(drawn)
    for name, w in WEIGHTS.items():
        share = drawn.count(name) / n
        assert abs(share - w) <= 3 * np.sqrt(w * (1 - w) / n), (name, share)
    # metrics.jsonl: per-dataset sample counts agree with samples.jsonl; per-dataset validation.
    rows = [json.loads(line) for line in (runs / "w2" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["kind"] == "train"][-1]
    assert {k: last[f"samples/{k}"] for k in WEIGHTS} == {k: drawn.count(k) for k in WEIGHTS}
    val_rows = [r for r in rows if r["kind"] == "val"]
    assert val_rows and all(np.isfinite(val_rows[-1][f"val_loss/{k}"]) for k in WEIGHTS)
    # The export knows both robots and predicts in each one's own units and size.
    exported = policy.load(runs / "w2" / "export")
    assert [e.name for e in exported.meta.embodiments] == ["demo", "arm"]
    assert exported.meta.embodiments[1].root == str(arm)
    assert exported.meta.embodiments[1].normalizer.stats["action"]["mean"].shape == (6,)
    demo_obs = {
        "observation.image": np.zeros((32, 32, 3), np.uint8),
        "observation.state": np.zeros(2, np.float32),
        "task": "reach the red disc",
    }
    arm_obs = {k: np.zeros((32, 32, 3), np.uint8) for k in ARM_CAMERAS}
    arm_obs |= {"observation.state": np.zeros(6, np.float32), "task": "pick up the red cube"}
    assert exported.predict_action(demo_obs, embodiment="demo").shape == (8, 2)
    assert exported.predict_action(arm_obs, embodiment="arm").shape == (8, 6)
    scored = [r for r in rows if r["kind"] == "eval"]
    assert scored and 0.0 <= scored[-1]["policy_success_rate"] <= 1.0
    assert eval_cli.main([str(runs / "w2" / "export"), "--episodes", "1"]) == 1  # which robot?
    assert (
        eval_cli.main([str(runs / "w2" / "export"), "--episodes", "1", "--embodiment", "demo"]) == 0
    )
    assert report.main([str(runs / "w2")]) == 0
    assert (runs / "w2" / "report" / "predictions.png").is_file()
