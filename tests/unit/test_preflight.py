"""Checks of a run against a robot's dataset before Ray starts: each finding one line with the
number that matters, errors refused with exit 2 before anything is started or written."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from robot_data import write_arm_dataset  # noqa: E402

from raytrain_vla import run as run_cli  # noqa: E402
from raytrain_vla.config import ConfigError, absolute_paths, parse_cli  # noqa: E402
from raytrain_vla.data.__main__ import main as data_cli  # noqa: E402
from raytrain_vla.train.preflight import check_before_ray, preflight  # noqa: E402

SMALL = {"observation.images.top": (48, 64), "observation.images.wrist": (24, 32)}
FITS = ["--data.image_size=[24,32]", "--model.flow_vla.max_text_len=128", "--eval.episodes=0"]


@pytest.fixture(scope="module")
def arm(tmp_path_factory) -> Path:
    return write_arm_dataset(tmp_path_factory.mktemp("arm") / "so100", cameras=SMALL)


def findings(root: Path, *args: str) -> dict[str, list[str]]:
    cfg = absolute_paths(parse_cli([f"--data.root={root}", *args]))
    out: dict[str, list[str]] = {"error": [], "warning": [], "note": []}
    for finding in preflight(cfg):
        out[finding.level].append(finding.message)
    return out


def test_a_config_that_fits_the_data_has_no_errors_and_says_what_the_model_sees(arm):
    found = findings(arm, *FITS)
    assert not found["error"]
    assert any("at 24x32: 12 vision tokens per camera, 24 per sample" in n for n in found["note"])
    assert any("longest instruction: 108 of the model's 128 bytes" in n for n in found["note"])


def test_cameras_of_different_resolutions_need_an_image_size(arm):
    (error,) = findings(arm, *FITS[1:])["error"]
    assert "observation.images.top 48x64, observation.images.wrist 24x32" in error
    assert "data.image_size" in error


def test_instructions_longer_than_the_text_budget_are_refused_or_cut_when_asked(arm):
    """flow_vla once cut instructions at 48 bytes silently."""
    (error,) = findings(arm, "--data.image_size=[24,32]")["error"]
    assert "6 of 6 instructions are longer than the model's text budget of 48 bytes" in error
    assert "max_text_len to 108" in error and "model.truncate_text=true" in error
    found = findings(arm, "--data.image_size=[24,32]", "--model.truncate_text=true")
    assert not found["error"]
    assert any("they are cut to 48 bytes" in w for w in found["warning"])


def test_many_vision_tokens_are_warned_with_a_size_that_fits(arm):
    found = findings(arm, "--data.image_size=[480,640]", *FITS[1:])
    (warning,) = [w for w in found["warning"] if "vision tokens" in w]
    assert "4800 vision tokens per camera" in warning and "data.image_size=[104, 144]" in warning


def test_episodes_shorter_than_a_chunk_are_counted(arm):
    found = findings(arm, *FITS, "--data.chunk_size=20")
    (warning,) = [w for w in found["warning"] if "shorter than data.chunk_size" in w]
    assert "2 of 6 episodes" in warning and "episode 2, 6 frames" in warning


def test_closed_loop_scoring_without_a_simulator_is_said_once(arm):
    """`eval.episodes: 50` was silently ignored on data other than the demo's."""
    found = findings(arm, *FITS[:2], "--eval.episodes=50")
    assert [n for n in found["note"] if "eval.episodes=50 is skipped" in n]
    assert not [n for n in findings(arm, *FITS)["note"] if "eval.episodes" in n]


def test_missing_videos_and_non_finite_statistics_are_errors(arm, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(arm, broken)
    next((broken / "videos").rglob("*.mp4")).unlink()
    stats_path = broken / "meta" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["action"]["std"][0] = float("nan")
    stats_path.write_text(json.dumps(stats))
    errors = " | ".join(findings(broken, *FITS)["error"])
    assert "missing video file" in errors and "action" in errors


def test_run_refuses_on_the_first_error_in_one_line_before_ray(arm, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_cli, "init_ray", lambda *a, **k: pytest.fail("Ray was started"))
    storage = tmp_path / "runs"
    assert run_cli.main([f"--data.root={arm}", f"--ray.storage_path={storage}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different resolutions" in err[0]
    assert not storage.exists()


def test_check_before_ray_prints_notes_and_counts_further_errors(arm, capsys):
    cfg = absolute_paths(parse_cli([f"--data.root={arm}", "--model.flow_vla.max_text_len=128"]))
    with pytest.raises(ConfigError, match="different resolutions"):
        check_before_ray(cfg)
    cfg = absolute_paths(parse_cli([f"--data.root={arm}", *FITS]))
    check_before_ray(cfg)
    assert "note: the model sees each camera at 24x32" in capsys.readouterr().out


def test_the_preflight_command_prints_every_finding_and_exits_1_on_errors(arm, capsys):
    assert data_cli(["preflight", str(arm)]) == 1
    out = capsys.readouterr().out
    assert "error: cameras have different resolutions" in out and "1 error(s)" in out
    assert data_cli(["preflight", str(arm), *FITS]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    assert data_cli(["preflight", str(arm), "--train.stepz=3"]) == 2
    assert "unknown key 'train.stepz'" in capsys.readouterr().err


def test_settings_that_cannot_apply_are_said_not_dropped(arm):
    quiet = findings(arm, *FITS)
    assert not any("cache" in w or "shuffle windows" in w for w in quiet["warning"] + quiet["note"])
    found = findings(arm, *FITS, "--data.cache_max_gb=5")
    assert any("data.cache_dir/data.cache_max_gb have no effect" in w for w in found["warning"])
    small = findings(arm, *FITS, "--data.shuffle_window=8")
    assert any("read tasks do not follow shuffle windows" in n for n in small["note"])


def test_the_preflight_command_checks_each_dataset_of_a_mixture(arm, tmp_path, capsys):
    """Without a root, `data preflight` checks the config's mixture: each dataset's findings
    and its files' problems, named by the mixture entry."""
    broken = tmp_path / "broken"
    shutil.copytree(arm, broken)
    next((broken / "videos").rglob("*.mp4")).unlink()
    mixture = f"--data.mixture=[{{root: {arm}, weight: 2}}, {{root: {broken}, name: other}}]"
    assert data_cli(["preflight", mixture, *FITS]) == 1
    out = capsys.readouterr().out
    assert "data.mixture 'other': " in out and out.count("missing video file") == 1  # said once
    assert data_cli(["preflight", f"--data.mixture=[{{root: {arm}}}]", *FITS]) == 0
    assert "0 error(s)" in capsys.readouterr().out
