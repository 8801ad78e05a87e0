"""Meta-World end to end on the session's cluster, through the README's own command lines (sizes
cut): expert demos (2 tasks x 2 episodes at 32 px) -> a few training steps with closed-loop
scoring -> `eval --env metaworld` on the export, twice. Plus the bookkeeping checked against the
expert, and the random baseline on MT10."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from raytrain_vla import eval as eval_cli
from raytrain_vla import policy as policy_lib
from raytrain_vla import run
from raytrain_vla.common.metaworld_tasks import DESCRIPTIONS, MT10, TASK_INDEX
from raytrain_vla.data.formats.episodes import read_episodes
from raytrain_vla.data.formats.lerobot import LeRobotMeta, read_frames_table
from raytrain_vla.data.inspect import find_problems
from raytrain_vla.data.metaworld_demos import roll_out_task
from raytrain_vla.data_cli import main as data_cli
from raytrain_vla.sim import metaworld_env as mw
from raytrain_vla.sim.metaworld_eval import evaluate_metaworld, policy_controller

pytestmark = pytest.mark.usefixtures("ray_cluster")
TASKS = ["reach-v3", "drawer-close-v3"]
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_args(module: str, fill: dict[str, str], *extra: str) -> list[str]:
    """The README's one `python -m raytrain_vla.<module> ... metaworld ...` line as arguments,
    words replaced by `fill`, then `extra` (later flags win)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith(f"python -m raytrain_vla.{module} ") and "metaworld" in line
    ]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0].split(" #", 1)[0])[3:]
    return [fill.get(w, w) for w in words] + list(extra)


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("metaworld") / "mw"
    fill = {"OUT": str(root), "mt10": ",".join(TASKS), "25": "2", "64": "32"}
    assert data_cli(readme_args("data", fill)) == 0
    return root, json.loads((root / "meta" / "metaworld.json").read_text())["per_task"]


def test_demos_are_a_clean_lerobot_dataset_of_successful_expert_episodes(demos):
    root, report = demos
    assert find_problems(root) == []
    meta = LeRobotMeta.load(root)
    assert meta.num_episodes == 4 and meta.fps == mw.FPS
    assert meta.tasks == [DESCRIPTIONS[t] for t in TASKS]
    assert set(meta.features) >= {
        "observation.image", "observation.state", "action", "timestamp", "frame_index",
        "episode_index", "index", "task_index",
    }  # fmt: skip
    assert meta.camera_shape("observation.image") == (3, 32, 32)
    assert meta.state_dim == 4 and meta.action_dim == 4
    table = read_frames_table(meta, ["action", "episode_index"])
    actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
    assert np.abs(actions).max() <= 1.0
    sidecar = json.loads((root / "meta" / "metaworld.json").read_text())
    assert sidecar["tasks"] == TASKS and sidecar["image_size"] == 32
    # The bookkeeping against the expert itself: each kept seed, replayed without a camera,
    # succeeds in exactly the episode's length, and attempts count the failures too.
    lengths = list(meta.episode_length)
    for k, task in enumerate(TASKS):
        assert report[task]["episodes"] == 2
        assert report[task]["expert_success_rate"] == 2 / report[task]["attempts"]
        env = mw.MetaWorldTask(task, image_size=None)
        for j, seed in enumerate(report[task]["reset_seeds"]):
            step, steps = env.reset(seed), 0
            while not step.done:
                step, steps = env.step(env.expert_action()), steps + 1
            assert step.success and steps == lengths[2 * k + j]
        env.close()


def test_the_same_seed_rolls_out_the_same_frames_states_and_actions():
    first, again = (list(roll_out_task("reach-v3", 1, 24, 7, 400, 3)) for _ in range(2))
    (a, first_summary), (b, again_summary) = first, again
    assert first_summary.seeds == again_summary.seeds
    for key in ("state", "action"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    np.testing.assert_array_equal(a.cameras[mw.IMAGE_KEY], b.cameras[mw.IMAGE_KEY])


@pytest.fixture(scope="module")
def trained(demos, tmp_path_factory) -> Path:
    """The README's training command on the demos, cut to 2 steps: its run directory."""
    root, _ = demos
    runs = tmp_path_factory.mktemp("runs")
    fill = {
        "--data.root=OUT": f"--data.root={root}", "--train.steps=6000": "--train.steps=2",
        "--eval.episodes=10": "--eval.episodes=2",
    }  # fmt: skip
    args = readme_args(
        "run", fill, "--data.val_fraction=0.25", "--train.global_batch_size=8",
        "--train.micro_batch_size=4", "--train.val_interval=2", "--train.save_interval=2",
        f"--ray.storage_path={runs}", "--ray.run_name=mw",
        "--logging.wandb_mode=disabled", "--logging.console=false", "--eval.max_steps=30",
        "--eval.rollouts_logged=1", "--eval.at_validation=true",
    )  # fmt: skip
    assert run.main(args) == 0
    return runs / "mw"


def test_train_scores_metaworld_and_eval_of_the_export_is_reproducible(trained, tmp_path, capsys):
    run_dir = trained
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (val,) = [r for r in records if r["kind"] == "val"]
    assert {"eval_success_rate", "eval_success_rate/easy", "eval_success_rate/reach-v3"} <= set(val)
    (final,) = [r for r in records if r["kind"] == "eval"]
    for name in ("policy", "random", "expert"):
        assert 0.0 <= final[f"{name}_success_rate"] <= 1.0
    # 30 steps are too few for either task's expert (35-90 steps) and for a 2-step policy.
    assert final["expert_success_rate"] == 0.0
    assert sorted(p.name for p in (run_dir / "rollouts").glob("*.mp4")) == [
        f"step000002_metaworld_{t}_ep0_failure.mp4" for t in sorted(TASKS)
    ]
    capsys.readouterr()
    lines = []
    for k in range(2):
        out = tmp_path / f"eval{k}"
        fill = {"runs/metaworld/export": str(run_dir / "export"), "mt10": "reach", "10": "2"}
        extra = ["--max-steps", "80", "--record", "1", "--workers", str(2 - k)]
        cli = readme_args("eval", {**fill, "OUT": str(out)}, *extra)
        assert eval_cli.main(cli) == 0
        lines.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert (out / "scores.json").is_file()
        assert len(list((out / "rollouts").glob("reach-v3_ep0_*.mp4"))) == 1
    assert lines[0] == lines[1]  # 2 actors, then 1: the same scores
    assert set(lines[0]["policy"]["per_task"]) == {"reach-v3"}
    assert lines[0]["expert"]["per_task"]["reach-v3"] == 1.0  # the expert reaches in 35-65 steps
    assert eval_cli.main(cli) == 1  # --out is not empty now: refused, nothing overwritten


def test_random_actions_almost_never_solve_mt10():
    scores, _ = evaluate_metaworld(
        None, list(MT10), episodes=1, seed=0, image_size=32, controllers=("random",), workers=2
    )
    assert scores["random"].success_rate <= 0.1


def test_lerobot_layout_is_metaworld_mt50s_and_trains_here(tmp_path):
    """`--layout lerobot` writes `lerobot/metaworld_mt50`'s features (PNG frames, 39-D
    environment state, reward, success, LeRobot's task ids, the expert's actions unclipped),
    and a run trains on it as it is."""
    root = tmp_path / "mt50_like"
    args = ["metaworld", str(root), "--tasks", ",".join(TASKS), "--episodes-per-task", "2"]
    assert data_cli([*args, "--image-size", "32", "--layout", "lerobot"]) == 0
    assert find_problems(root) == []
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["robot_type"] == "metaworld" and info["fps"] == 80
    mt50 = {  # lerobot/metaworld_mt50's meta/info.json, at 32 px instead of 480
        "observation.state": ("float32", [4]), "action": ("float32", [4]),
        "next.reward": ("float32", [1]), "next.success": ("bool", [1]),
        "observation.environment_state": ("float32", [39]),
        "observation.image": ("image", [3, 32, 32]), "task_id": ("int16", [1]),
        "timestamp": ("float32", [1]), "frame_index": ("int64", [1]),
        "episode_index": ("int64", [1]), "index": ("int64", [1]), "task_index": ("int64", [1]),
    }  # fmt: skip
    assert {k: (f["dtype"], f["shape"]) for k, f in info["features"].items()} == mt50
    assert info["features"]["action"]["names"] == {"axes": ["x", "y", "z", "gripper"]}
    meta = LeRobotMeta.load(root)
    cols = ["action", "observation.state", "observation.environment_state", "next.success"]
    table = read_frames_table(meta, [*cols, "task_id"])
    episode = table.column("episode_index").to_numpy()
    state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))
    env_state = np.stack(table.column("observation.environment_state").to_numpy(False))
    np.testing.assert_array_equal(env_state[:, :4], state)
    success = table.column("next.success").to_numpy(zero_copy_only=False)
    ends = np.r_[episode[1:] != episode[:-1], True]
    np.testing.assert_array_equal(success, ends)  # the expert's success ends each episode
    task_ids = table.column("task_id").to_numpy()
    assert sorted(set(task_ids.tolist())) == sorted(TASK_INDEX[t] for t in TASKS)
    # The stored actions are the expert's own, unclipped, and replaying them reproduces
    # each episode's success at its last frame.
    actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
    assert np.abs(actions).max() > 1.0
    seeds = json.loads((root / "meta" / "metaworld.json").read_text())["per_task"]
    for k, task in enumerate(TASKS):
        env = mw.MetaWorldTask(task, image_size=None)
        rows = np.flatnonzero(episode == 2 * k)
        env.reset(seeds[task]["reset_seeds"][0])
        steps = [env.step(a) for a in actions[rows]]
        assert steps[-1].success and not any(s.success for s in steps[:-1])
        env.close()
    runs = tmp_path / "runs"
    assert run.main([
        f"--data.root={root}", "--data.val_fraction=0.25", "--train.steps=2",
        "--train.global_batch_size=8", "--train.micro_batch_size=4", "--train.val_interval=2",
        "--train.save_interval=2", f"--ray.storage_path={runs}", "--ray.run_name=mt50_like",
        "--logging.wandb_mode=disabled", "--logging.console=false", "--eval.episodes=0",
    ]) == 0  # fmt: skip
    records = [json.loads(line) for line in (runs / "mt50_like" / "metrics.jsonl").open()]
    assert any(r["kind"] == "val" and np.isfinite(r["val_action_mse"]) for r in records)


def test_dagger_appends_policy_driven_episodes_labelled_by_the_expert(trained, tmp_path, capsys):
    """`data metaworld --base B --policy P`: B's episodes first, bit for bit, then episodes the
    policy drove (replaying the policy from the same seed reproduces their states) whose every
    action is the expert's at the state the policy reached; failures are kept too, cut at
    `--policy-max-steps` while the dataset keeps its step limit."""
    base, out, export = tmp_path / "base", tmp_path / "dagger", trained / "export"
    common = ["--tasks", "reach-v3", "--episodes-per-task"]
    assert data_cli(["metaworld", str(base), *common, "1", "--image-size", "32",
                     "--layout", "lerobot", "--max-steps", "100"]) == 0  # fmt: skip
    refused = [
        ["--image-size", "64"],  # the base fixes the frame size
        ["--n-action-steps", "2"],  # without --policy it means nothing
        ["--policy-max-steps", "30"],  # nor this
        ["--policy", str(export), "--policy-max-steps", "101"],  # past the base's step limit
    ]
    for extra in refused:
        capsys.readouterr()
        assert data_cli(["metaworld", str(out), *common, "1", "--base", str(base), *extra]) == 1
        assert capsys.readouterr().err.count("\n") == 1 and not out.exists()
    expert_again = ["metaworld", str(out), *common, "1", "--base", str(base), "--seed", "0"]
    assert data_cli(expert_again) == 1 and not out.exists()  # would replay the base's scene
    args = [*common, "2", "--base", str(base), "--policy", str(export), "--seed", "50"]
    cut = ["--n-action-steps", "2", "--policy-max-steps", "30"]
    assert data_cli(["metaworld", str(out), *args, *cut]) == 0
    assert find_problems(out) == []
    sidecar = json.loads((out / "meta" / "metaworld.json").read_text())
    assert sidecar["policy"] == {"policy_dir": str(export), "n_action_steps": 2, "max_steps": 30}
    assert sidecar["base"]["root"] == str(base) and sidecar["layout"] == "lerobot"
    assert sidecar["max_steps"] == 100
    report = sidecar["per_task"]["reach-v3"]
    assert report["episodes"] == report["attempts"] == 2 and report["reset_seeds"] == [50, 51]
    copied, *driven = list(read_episodes(out))
    (original,) = list(read_episodes(base))
    for key in ("state", "action"):
        np.testing.assert_array_equal(getattr(copied, key), getattr(original, key))
    np.testing.assert_array_equal(copied.cameras[mw.IMAGE_KEY], original.cameras[mw.IMAGE_KEY])
    env = mw.MetaWorldTask("reach-v3", image_size=32, max_steps=30)
    policy = policy_lib.load(export, seed=50, n_action_steps=2)
    successes = 0
    for episode, seed in zip(driven, report["reset_seeds"], strict=True):
        raw = episode.extra["observation.environment_state"].astype(np.float64)
        labels = np.stack([env.expert.get_action(obs) for obs in raw])
        np.testing.assert_allclose(episode.action, labels, atol=1e-3)
        step, act, states = env.reset(seed), policy_controller(policy, env), []
        while not step.done:
            states.append(step.state)
            step = env.step(act(step))
        np.testing.assert_array_equal(np.stack(states), episode.state)
        assert len(states) <= 30
        assert bool(episode.extra["next.success"][-1]) == step.success
        successes += step.success
    env.close()
    assert report["policy_success_rate"] == successes / 2
