"""The Meta-World benchmark scripts wire their stages right. metaworld_mt10.sh: each DAgger round
rolls out the last policy on fresh reset seeds, extends the last dataset, and trains from the
last export; the eval scores the last round's policy. metaworld_four_tasks.sh: its arms train
on the same demos for the same steps, differ only in their own overrides, and are scored alike.
A stub interpreter records the commands and creates each stage's output, so the tests take
milliseconds and start nothing."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "metaworld_mt10.sh"
FOUR_TASKS_SCRIPT = BENCHMARKS / "metaworld_four_tasks.sh"

STUB = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] == "-c":  # the script's closing summary: run it for real
    os.execv({python!r}, [{python!r}, *args])
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
if args[1] == "raytrain_vla.data_cli":
    (Path(args[3]) / "meta").mkdir(parents=True)
    (Path(args[3]) / "meta" / "info.json").write_text("{{}}")
elif args[1] == "raytrain_vla.run":
    (Path(flags["ray.storage_path"]) / flags["ray.run_name"] / "export").mkdir(parents=True)
    print("summary: " + json.dumps({{"wall_s": 9.5, "samples_per_s": 64.0, "val_mse_ratio": 0.25}}))
elif args[1] == "raytrain_vla.eval":
    out = Path(args[args.index("--out") + 1])
    out.mkdir(parents=True)
    score = {{"success_rate": 0.5, "per_task": {{}}}}
    (out / "scores.json").write_text(json.dumps({{"policy": score}}))
"""


def run_script(
    tmp_path: Path, script: Path = SCRIPT, **env: str
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    stub = tmp_path / "stub_python"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    log = tmp_path / "commands.jsonl"
    result = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")],
        env={**os.environ, "PY": str(stub), "STUB_LOG": str(log), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    commands = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, commands


def value(command: list[str], flag: str) -> str:
    """`--flag V` or `--flag=V` in a recorded command."""
    for i, arg in enumerate(command):
        if arg == flag:
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {shlex.join(command)}")


def stage_target(command: list[str]) -> str:
    """What a stage writes (data), trains (run name) or scores (export)."""
    module = command[1]
    if module == "raytrain_vla.run":
        return value(command, "--ray.run_name")
    return command[3] if module == "raytrain_vla.data_cli" else command[2]


def test_two_rounds_chain_data_policies_and_seeds(tmp_path: Path) -> None:
    result, commands = run_script(
        tmp_path, DAGGER_ROUNDS="2", DAGGER_EPISODES="7", STEPS="30", DAGGER_STEPS="40",
        DAGGER_MAX_STEPS="150",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    stages = [(c[1], stage_target(c)) for c in commands]
    assert stages == [
        ("raytrain_vla.data_cli", str(out / "data")),
        ("raytrain_vla.run", "flow_vla"),
        ("raytrain_vla.data_cli", str(out / "data_dagger1")),
        ("raytrain_vla.run", "flow_vla_dagger1"),
        ("raytrain_vla.data_cli", str(out / "data_dagger2")),
        ("raytrain_vla.run", "flow_vla_dagger2"),
        ("raytrain_vla.eval", str(out / "flow_vla_dagger2" / "export")),
    ]
    _, first, round1, train1, round2, train2, _ = commands
    assert value(first, "--train.steps") == "30"
    assert (value(round1, "--base"), value(round1, "--policy")) == (
        str(out / "data"), str(out / "flow_vla" / "export"),
    )  # fmt: skip
    assert (value(round2, "--base"), value(round2, "--policy")) == (
        str(out / "data_dagger1"), str(out / "flow_vla_dagger1" / "export"),
    )  # fmt: skip
    assert (value(round1, "--seed"), value(round2, "--seed")) == ("2000", "2007")
    assert value(round1, "--episodes-per-task") == "7"
    assert value(round1, "--policy-max-steps") == value(round2, "--policy-max-steps") == "150"
    assert value(train1, "--model.init_from") == str(out / "flow_vla" / "export")
    assert value(train2, "--model.init_from") == str(out / "flow_vla_dagger1" / "export")
    assert value(train2, "--data.root") == str(out / "data_dagger2")
    assert value(train2, "--train.steps") == "40"
    assert "MT10 policy: 0.50" in result.stdout


def test_rerun_keeps_finished_stages(tmp_path: Path) -> None:
    """A rerun with one more round adds that round and scores its policy in a directory of its
    own: the first run's eval stays, and the eval (which, like the stub, refuses a non-empty
    `--out`) does not stop the script."""
    first, _ = run_script(tmp_path, DAGGER_ROUNDS="1")
    assert first.returncode == 0, first.stderr
    (tmp_path / "commands.jsonl").unlink()
    result, commands = run_script(tmp_path, DAGGER_ROUNDS="2")
    assert result.returncode == 0, result.stderr
    assert [c[1] for c in commands] == [
        "raytrain_vla.data_cli",
        "raytrain_vla.run",
        "raytrain_vla.eval",
    ]
    out = tmp_path / "out"
    assert value(commands[0], "--base") == str(out / "data_dagger1")
    assert value(commands[-1], "--out") == str(out / "eval_flow_vla_dagger2")
    assert (out / "eval_flow_vla_dagger1" / "scores.json").is_file()
    assert "MT10 policy: 0.50" in result.stdout


def test_no_dagger_scores_the_first_policy(tmp_path: Path) -> None:
    _, commands = run_script(tmp_path, DAGGER_EPISODES="0")
    assert [c[1] for c in commands] == [
        "raytrain_vla.data_cli",
        "raytrain_vla.run",
        "raytrain_vla.eval",
    ]
    assert commands[-1][2] == str(tmp_path / "out" / "flow_vla" / "export")


@pytest.mark.parametrize(
    ("name", "bad"),
    [("DAGGER_ROUNDS", "0"), ("STEPS", "4k"), ("DAGGER_EPISODES", "-1"), ("DAGGER_MAX_STEPS", "0")],
)
def test_bad_setting_is_one_line_before_any_stage(tmp_path: Path, name: str, bad: str) -> None:
    result, commands = run_script(tmp_path, **{name: bad})
    assert result.returncode == 2
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0]
    assert f"bad {name}={bad}" in result.stderr
    assert commands == []


def test_four_task_arms_share_demos_steps_and_scoring(tmp_path: Path) -> None:
    result, commands = run_script(tmp_path, FOUR_TASKS_SCRIPT, STEPS="30")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert [(c[1], stage_target(c)) for c in commands] == [
        ("raytrain_vla.data_cli", str(out / "data")),
        ("raytrain_vla.run", "at128"),
        ("raytrain_vla.eval", str(out / "at128" / "export")),
        ("raytrain_vla.run", "at256"),
        ("raytrain_vla.eval", str(out / "at256" / "export")),
    ]
    data, train128, eval128, train256, eval256 = commands
    assert value(data, "--image-size") == "256"
    tasks = "reach,push,pick-place,peg-insert-side"
    assert value(data, "--tasks") == value(eval128, "--tasks") == value(eval256, "--tasks") == tasks
    for train in (train128, train256):
        assert value(train, "--data.root") == str(out / "data")
        assert value(train, "--train.steps") == "30"
    assert value(train128, "--data.image_size") == "[128,128]"
    assert "--model.flow_vla.vision_strides=[2,2,2,2]" not in train128
    assert value(train256, "--model.flow_vla.vision_strides") == "[2,2,2,2]"
    assert not any(a.startswith("--data.image_size") for a in train256)
    last_shift = [
        [a for a in t if a.startswith("--data.augment.max_shift_px=")][-1]
        for t in (train128, train256)
    ]
    assert last_shift == ["--data.augment.max_shift_px=4", "--data.augment.max_shift_px=8"]
    for ev in (eval128, eval256):
        assert (value(ev, "--seed"), value(ev, "--episodes")) == ("1000", "10")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["at256"] == {
        "success_rate": 0.5, "per_task": {}, "train_wall_s": 9.5, "samples_per_s": 64.0,
        "val_mse_ratio": 0.25,
    }  # fmt: skip


def test_four_tasks_bad_setting_is_one_line_before_any_stage(tmp_path: Path) -> None:
    result, commands = run_script(tmp_path, FOUR_TASKS_SCRIPT, STEPS="2k")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "metaworld_four_tasks.sh: bad STEPS=2k, expected a positive integer"
    )
    assert commands == []


def test_action_clip_reaches_every_training_run_and_nothing_else(tmp_path: Path) -> None:
    result, commands = run_script(tmp_path, ACTION_CLIP="-1,1", DAGGER_ROUNDS="2")
    assert result.returncode == 0, result.stderr
    trains = [c for c in commands if c[1] == "raytrain_vla.run"]
    assert len(trains) == 3
    assert all(value(c, "--data.action_clip") == "[-1,1]" for c in trains)
    others = [c for c in commands if c[1] != "raytrain_vla.run"]
    assert not any(a.startswith("--data.action_clip") for c in others for a in c)
    (tmp_path / "plain").mkdir()
    _, plain = run_script(tmp_path / "plain")
    assert not any(a.startswith("--data.action_clip") for c in plain for a in c)


def test_keypoint_arm_is_the_128_px_arm_plus_keypoints(tmp_path: Path) -> None:
    result, commands = run_script(tmp_path, FOUR_TASKS_SCRIPT, ARMS="at128 kp32", STEPS="30")
    assert result.returncode == 0, result.stderr
    train128, train_kp = [c for c in commands if c[1] == "raytrain_vla.run"]
    assert value(train_kp, "--ray.run_name") == "kp32"
    assert value(train_kp, "--model.flow_vla.keypoints") == "32"
    assert [a for a in train_kp if a != "--model.flow_vla.keypoints=32"] == [
        a.replace("at128", "kp32") for a in train128
    ]
    evals = [c for c in commands if c[1] == "raytrain_vla.eval"]
    assert [c[2] for c in evals] == [
        str(tmp_path / "out" / a / "export") for a in ("at128", "kp32")
    ]
    assert sorted(json.loads(result.stdout.strip().splitlines()[-1])) == ["at128", "kp32"]


@pytest.mark.parametrize("arms", ["", "at128 wide"])
def test_unknown_arm_is_one_line_before_any_stage(tmp_path: Path, arms: str) -> None:
    result, commands = run_script(tmp_path, FOUR_TASKS_SCRIPT, ARMS=arms)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"metaworld_four_tasks.sh: bad ARMS='{arms}'" in result.stderr
    assert commands == []


@pytest.mark.parametrize("script", [SCRIPT, FOUR_TASKS_SCRIPT])
def test_bad_action_clip_is_one_line_before_any_stage(tmp_path: Path, script: Path) -> None:
    result, commands = run_script(tmp_path, script, ACTION_CLIP="1")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{script.name}: bad ACTION_CLIP=1, expected LOW,HIGH (e.g. -1,1) or empty"
    )
    assert commands == []
