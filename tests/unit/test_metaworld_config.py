"""Meta-World's task tables, how a run names what it scores, and the refusals before Ray starts.
No MuJoCo here: the tables are plain data and the dataset is written by our own writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raytrain_vla.common.metaworld_tasks import (
    DESCRIPTIONS,
    GROUPS,
    MT10,
    MT50,
    TASK_INDEX,
    eval_tasks,
    resolve_tasks,
)
from raytrain_vla.config import ConfigError, absolute_paths, parse_cli
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)
from raytrain_vla.data.metaworld_demos import write_metaworld_dataset
from raytrain_vla.sim.metaworld_eval import ControllerScore, scores_json
from raytrain_vla.train.preflight import preflight


def test_tables_cover_mt50_once_with_groups_and_mt10_inside():
    assert len(MT50) == 50 and len(set(MT50)) == 50
    grouped = [t for names in GROUPS.values() for t in names]
    assert sorted(grouped) == sorted(MT50)
    assert [len(GROUPS[g]) for g in ("easy", "medium", "hard", "very_hard")] == [28, 11, 6, 5]
    assert set(MT10) <= set(MT50) and len(MT10) == 10
    assert DESCRIPTIONS["pick-place-v3"] == "Pick and place a puck to a goal"


def test_task_ids_are_lerobots_task_name_to_id():
    """`task_id` as LeRobot's `metaworld_config.json` numbers the tasks (not MT50's order)."""
    assert sorted(TASK_INDEX) == sorted(MT50) and sorted(TASK_INDEX.values()) == list(range(50))
    assert [TASK_INDEX[t] for t in ("assembly-v3", "button-press-v3", "push-v3", "reach-v3")] == [
        0, 6, 38, 40,
    ]  # fmt: skip
    assert (TASK_INDEX["window-open-v3"], TASK_INDEX["window-close-v3"]) == (48, 49)


def test_task_specs_resolve_in_order_once_and_name_what_is_unknown():
    assert resolve_tasks("mt10") == list(MT10)
    assert resolve_tasks("reach, hard,reach-v3") == ["reach-v3", *GROUPS["hard"]]
    assert len(resolve_tasks("MT50")) == 50
    with pytest.raises(ValueError, match="unknown Meta-World task 'pick-plce'"):
        resolve_tasks("reach,pick-plce")
    with pytest.raises(ValueError, match="no Meta-World tasks"):
        resolve_tasks(" , ")


def test_a_run_scores_the_dataset_s_tasks_unless_told_and_refuses_other_data():
    data_tasks = [DESCRIPTIONS["drawer-close-v3"], DESCRIPTIONS["reach-v3"]]
    assert eval_tasks("", data_tasks) == ["drawer-close-v3", "reach-v3"]
    assert eval_tasks("push", data_tasks) == ["push-v3"]
    with pytest.raises(ValueError, match="none of the dataset's tasks"):
        eval_tasks("", ["reach the red disc"])


def test_groups_and_overall_rates_are_means_over_tasks():
    score = ControllerScore(
        "policy", {"reach-v3": 1.0, "door-open-v3": 0.5, "push-v3": 0.0}, episodes_per_task=2
    )
    assert score.by_group == {"easy": 0.75, "hard": 0.0}
    assert score.success_rate == pytest.approx(0.5)
    assert score.to_dict()["per_task"]["door-open-v3"] == 0.5


def test_scores_json_keeps_context_and_every_controller_apart():
    score = ControllerScore("policy", {"reach-v3": 1.0}, episodes_per_task=1)
    line = json.loads(scores_json({"policy": score}, seed=1000, policy_dir="runs/x/export"))
    assert line["policy_dir"] == "runs/x/export" and line["policy"]["success_rate"] == 1.0
    with pytest.raises(ValueError, match="would hide controllers' scores"):
        scores_json({"policy": score}, policy="runs/x/export")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--eval.tasks=mt10,sweep-it"], "'eval.tasks': unknown Meta-World task 'sweep-it'"),
        (["--eval.max_steps=600"], "bad value for 'eval.max_steps': 600, expected 1..500"),
        (["--eval.workers=0"], "bad value for 'eval.workers': 0"),
        (
            ["--data.mixture=[{root: a, weight: 1}, {root: b, weight: 1}]"],
            "eval.env=metaworld scores a policy of one dataset",
        ),
    ],
)
def test_bad_metaworld_eval_keys_are_refused_at_load(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_cli(["--eval.env=metaworld", "--eval.episodes=2", *args])


@pytest.mark.parametrize("key", ["tasks=mt10", "max_steps=200", "workers=4"])
def test_metaworld_keys_are_refused_with_the_demo_env_not_ignored(key):
    with pytest.raises(ConfigError, match=f"'eval.{key.split('=')[0]}' applies to eval.env"):
        parse_cli([f"--eval.{key}"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "mt10"], "--tasks applies to --env metaworld only"),
        (["--no-baselines"], "--no-baselines applies to --env metaworld only"),
        (["--env", "metaworld", "--record", "2"], "--record writes mp4s into --out"),
        (["--env", "metaworld", "--embodiment", "arm"], "--embodiment applies to --env demo"),
    ],
)
def test_eval_cli_refuses_flags_it_would_ignore_in_one_line(args, message, capsys):
    from raytrain_vla import eval as eval_cli

    assert eval_cli.main(["some/policy", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def _fake_metaworld_data(root: Path, state_dim: int = 4) -> Path:
    """Two episodes named with Meta-World instructions (random pixels, LeRobot's keys)."""
    rng = np.random.default_rng(0)
    episodes = [
        EpisodeData(
            {"observation.image": rng.integers(0, 255, (12, 16, 16, 3), dtype=np.uint8)},
            rng.normal(size=(12, state_dim)).astype(np.float32),
            rng.uniform(-1, 1, (12, 4)).astype(np.float32),
            DESCRIPTIONS[task],
        )
        for task in ("reach-v3", "window-open-v3")
    ]
    spec = DatasetSpec(80, VideoSpec("libx264", 18, 2, "ultrafast"), robot_type="sawyer")
    return write_lerobot_dataset(root, episodes, spec)


def _findings(root: Path, *args: str) -> dict[str, list[str]]:
    cfg = absolute_paths(
        parse_cli(
            [
                f"--data.root={root}",
                "--eval.env=metaworld",
                "--eval.episodes=3",
                "--train.global_batch_size=4",
                "--train.micro_batch_size=2",
                *args,
            ]
        )
    )
    out: dict[str, list[str]] = {"error": [], "warning": [], "note": []}
    for finding in preflight(cfg):
        out[finding.level].append(finding.message)
    return out


def test_preflight_says_which_tasks_are_scored_and_refuses_data_meta_world_cannot_feed(tmp_path):
    good = _findings(_fake_metaworld_data(tmp_path / "mw"))
    assert not good["error"]
    assert any(
        "3 episodes of each of 2 tasks (reach-v3, window-open-v3)" in n for n in good["note"]
    )
    (error,) = _findings(_fake_metaworld_data(tmp_path / "six", state_dim=6))["error"]
    assert "6-D state" in error and "4-D state" in error


def _fake_base(root: Path, **settings) -> Path:
    """A directory with only the sidecar `data metaworld` writes: all `--base` is checked by."""
    (root / "meta").mkdir(parents=True)
    sidecar = {"layout": "lerobot", "image_size": 32, "max_steps": 500, **settings}
    sidecar.setdefault("per_task", {"reach-v3": {"reset_seeds": [0, 1, 4]}})
    (root / "meta" / "metaworld.json").write_text(json.dumps(sidecar))
    return root


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"image_size": 64}, "--image-size 64 differs from --base's 32"),
        ({"layout": "ours"}, "--layout ours differs from --base's lerobot"),
        ({"max_steps": 300}, "--max-steps 300 differs from --base's 500"),
        ({"seed": 3}, "pick --seed 5 or above"),  # the expert would replay seed 4's scene
    ],
)
def test_a_base_dataset_fixes_its_settings_and_scenes_before_ray_starts(tmp_path, kwargs, message):
    base = _fake_base(tmp_path / "base")
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        write_metaworld_dataset(tmp_path / "out", "reach-v3", 2, base=base, **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_base_without_the_sidecar_is_named(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match="only a dataset `data metaworld` wrote"):
        write_metaworld_dataset(tmp_path / "out", "reach-v3", 2, base=tmp_path / "plain")
