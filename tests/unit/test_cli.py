"""The commands explain themselves: `--help` lists every config key, and a sweep obeys the
command line over its space file's `fixed:` values."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain_vla import run as run_cli
from raytrain_vla import tune as tune_cli
from raytrain_vla.config import load_config
from raytrain_vla.config.help import key_help
from raytrain_vla.config.keys import valid_keys
from raytrain_vla.config.parse import command_line_keys
from raytrain_vla.tuning.space import SpaceError, load_space


def leaf_keys() -> set[str]:
    sections = {k.rsplit(".", 1)[0] for k in valid_keys() if "." in k}
    return {k for k in valid_keys() if k not in sections}


def help_keys(text: str) -> list[str]:
    return re.findall(r"^ *--([\w.]+)", text, flags=re.M)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_help_lists_every_schema_key_with_type_default_and_meaning(flag, capsys):
    assert run_cli.main([flag]) == 0
    text = capsys.readouterr().out
    listed = help_keys(text)
    assert set(listed) - {"config"} == leaf_keys()
    assert len(listed) == len(leaf_keys()) + 1  # each key once, plus --config
    assert "--train.steps int (default: 3000)" in text
    assert '--train.precision {fp32,bf16} (default: "fp32")' in text


def test_every_key_has_a_one_line_meaning_from_the_schema():
    missing = [row.key for row in key_help() if not row.meaning]
    assert not missing, f"schema fields without a comment: {missing}"


def test_help_is_printed_even_next_to_bad_overrides(capsys):
    assert run_cli.main(["--train.stepz=3", "--help"]) == 0
    assert "--data.root" in capsys.readouterr().out


def test_tune_help_lists_its_own_options_and_every_key(capsys):
    assert tune_cli.main(["--help"]) == 0
    listed = help_keys(capsys.readouterr().out)
    assert {"space", "name", "config"} <= set(listed)
    assert leaf_keys() <= set(listed)


def test_tune_usage_errors_are_one_line(capsys):
    assert tune_cli.main(["--train.steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--space" in err[0]


def test_help_through_the_module_entry_point_counts_every_key():
    out = subprocess.run(
        [sys.executable, "-m", "raytrain_vla.run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sum(1 for line in out.splitlines() if re.match(r"^ *--", line)) == len(leaf_keys()) + 1


def test_command_line_keys_are_the_dotted_leaves_given():
    keys = command_line_keys(
        ["--config", "x.yaml", "--train.steps=30", "--ray.num_workers", "[1,2]"]
    )
    assert keys == {"train.steps": 30, "ray.num_workers": [1, 2]}


def test_a_command_line_override_wins_over_the_spaces_fixed_value(capsys):
    base = load_config(None, ["--train.steps=30", "--ray.num_workers=1"])
    space = load_space(
        "tune_spaces/lr_groups.yaml",
        base,
        {"train.steps": 30, "ray.num_workers": 1},
    )
    assert "train.steps" not in space.fixed  # the file says 1000
    assert "num_workers" not in space.resources  # the file says 2
    assert space.fixed["train.val_interval"] == 100  # untouched keys stay
    notes = " ".join(space.replaced_by_command_line)
    assert "--train.steps=30" in notes and "train.steps=1000" in notes
    assert "--ray.num_workers=1" in notes

    from raytrain_vla.tuning.space import trial_config

    trial, _ = trial_config(space, base, {"optimizer.groups.vision.lr": 1e-4})
    assert trial.train.steps == 30 and trial.ray.num_workers == 1


def test_a_command_line_override_of_a_searched_key_is_refused():
    base = load_config(None, ["--optimizer.train_action_expert_only=true"])
    with pytest.raises(SpaceError, match="is searched by the space.*train_action_expert_only"):
        load_space("tune_spaces/lr_groups.yaml", base, {"optimizer.train_action_expert_only": True})


def test_tune_cli_passes_the_command_line_to_the_space(monkeypatch, capsys):
    """`tune --space lr_groups.yaml --train.steps=30` once ran 16 trials of 1,000 steps."""

    def stop_before_ray(data_cfg):
        raise SystemExit(0)

    monkeypatch.setattr("raytrain_vla.data.demo.ensure_dataset", stop_before_ray)
    with pytest.raises(SystemExit):
        tune_cli.main(["--space", "tune_spaces/lr_groups.yaml", "--train.steps=30"])
    assert "--train.steps=30 from the command line replaces" in capsys.readouterr().out


def test_a_mistyped_data_root_is_refused_naming_the_closest_path(tmp_path, capsys):
    """A typo once got a 1,500-episode demo dataset written there, and trained on it."""
    (tmp_path / "robot_data").mkdir()
    storage = tmp_path / "runs"
    typo = tmp_path / "robot_dta"
    assert run_cli.main([f"--data.root={typo}", f"--ray.storage_path={storage}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(typo) in err[0] and str(tmp_path / "robot_data") in err[0]
    assert not typo.exists() and not storage.exists()


def test_the_nearest_existing_path_when_no_name_is_close(tmp_path):
    from raytrain_vla.config.data_root import nearest_existing

    assert nearest_existing(tmp_path / "zzz" / "a" / "b").startswith(str(tmp_path) + " (exists")
    (tmp_path / "datasets").mkdir()
    assert nearest_existing(tmp_path / "datsets" / "x") == str(tmp_path / "datasets")


def test_the_demo_is_written_only_when_asked_for(tmp_path, monkeypatch):
    from raytrain_vla.config import absolute_paths, parse_cli
    from raytrain_vla.config import data_root as locate
    from raytrain_vla.data import demo

    written = []
    monkeypatch.setattr(demo, "write_demo_dataset", lambda root, n, seed: written.append(root))
    monkeypatch.setattr(locate, "DEMO_CACHE", tmp_path / "cache")
    cfg = absolute_paths(parse_cli(["--data.root=demo", "--data.demo_episodes=40"]))
    assert cfg.data.root == str(tmp_path / "cache" / "demo_v1_40ep_seed0")  # not the 1500's
    demo.ensure_dataset(cfg.data)
    explicit = tmp_path / "bench"
    cfg = absolute_paths(
        parse_cli([f"--data.root={explicit}", "--data.write_demo_if_missing=true"])
    )
    demo.ensure_dataset(cfg.data)
    assert written == [tmp_path / "cache" / "demo_v1_40ep_seed0", explicit]
    assert absolute_paths(parse_cli([])).data.root == str(tmp_path / "cache" / "demo_v1")


def test_a_dataset_by_repo_id_comes_from_the_local_lerobot_cache(tmp_path, monkeypatch):
    from _paths import fixtures_root

    from raytrain_vla.config import ConfigError, absolute_paths, parse_cli
    from raytrain_vla.data import demo

    fixture = fixtures_root() / "lerobot_v3"
    name = "pusht_like"
    home = tmp_path / "hf_lerobot"
    (home / "lerobot").mkdir(parents=True)
    (home / "lerobot" / name).symlink_to(fixture / name)
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    cfg = absolute_paths(parse_cli([f"--data.repo_id=lerobot/{name}"]))
    assert cfg.data.root == str((fixture / name).resolve())
    assert demo.ensure_dataset(cfg.data).resolve() == (fixture / name).resolve()

    cfg = absolute_paths(parse_cli(["--data.repo_id=lerobot/not_downloaded"]))
    with pytest.raises(ConfigError, match=f"not in the local LeRobot cache; looked in {home}"):
        demo.ensure_dataset(cfg.data)
    with pytest.raises(ConfigError, match="give one of them"):
        absolute_paths(parse_cli(["--data.repo_id=lerobot/x", f"--data.root={tmp_path}"]))
    with pytest.raises(ConfigError, match="expected OWNER/NAME"):
        absolute_paths(parse_cli(["--data.repo_id=../x"]))


def test_lerobot_home_follows_lerobots_own_rules(monkeypatch, tmp_path):
    from raytrain_vla.config.data_root import lerobot_home

    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert lerobot_home() == tmp_path / "hf" / "lerobot"
    monkeypatch.delenv("HF_HOME")
    assert lerobot_home() == Path("~/.cache/huggingface/lerobot").expanduser()


def test_long_commands_show_progress(tmp_path, monkeypatch, capsys):
    """Writing the demo, `data inspect` and closed-loop scoring printed nothing for minutes."""
    import numpy as np

    from raytrain_vla.data_cli import main as data_cli
    from raytrain_vla.sim.closed_loop import run_episodes

    monkeypatch.setenv("RAYTRAIN_VLA_PROGRESS", "1")  # stderr is not a terminal here
    assert data_cli(["demo", str(tmp_path / "d"), "--episodes", "3"]) == 0
    assert "demo episodes" in capsys.readouterr().err
    assert data_cli(["inspect", str(tmp_path / "d")]) == 0
    assert "inspect " in capsys.readouterr().err
    run_episodes("random", lambda obs: np.zeros(2), lambda: None, 2, 0, 32)
    assert "closed loop: random" in capsys.readouterr().err
    monkeypatch.setenv("RAYTRAIN_VLA_PROGRESS", "0")
    assert data_cli(["inspect", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().err == ""
