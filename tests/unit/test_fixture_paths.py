"""Tests that need `../shared/fixtures` skip where it is absent, naming it, but fail under
`CI=true`: a CI job that lost its fixtures must not pass by skipping them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _paths
import pytest


@pytest.fixture
def nowhere(tmp_path, monkeypatch) -> Path:
    missing = tmp_path / "no" / "fixtures"
    monkeypatch.setattr(_paths, "CANDIDATES", (missing,))
    return missing


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_missing_fixtures_fail_under_ci_naming_the_folder(nowhere, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=f"not found: {nowhere} .*CI=true"):
        _paths.fixtures_root()


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_missing_fixtures_skip_outside_ci_naming_the_folder(nowhere, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=f"not found: {nowhere} "):
        _paths.fixtures_root()


def test_the_first_folder_that_exists_is_the_root(tmp_path, monkeypatch):
    monkeypatch.setattr(_paths, "CANDIDATES", (tmp_path / "absent", tmp_path))
    monkeypatch.setenv("CI", "true")
    assert _paths.fixtures_root() == tmp_path


MODULE = """
from pathlib import Path

import _paths

_paths.CANDIDATES = (Path({missing!r}),)
ROOT = _paths.fixtures_root()  # at import, as test_smolvla_lerobot.py does


def test_needs_the_fixtures():
    assert ROOT.is_dir()
"""


@pytest.mark.parametrize("ci", ["true", None])
def test_a_module_needing_missing_fixtures_fails_the_run_under_ci(tmp_path, ci):
    """The real thing: pytest on a module that asks for the fixtures at import."""
    missing = tmp_path / "gone" / "fixtures"
    (tmp_path / "test_needs_fixtures.py").write_text(MODULE.format(missing=str(missing)))
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(_paths.__file__).parent), env.get("PYTHONPATH", "")]
    )
    if ci:
        env["CI"] = ci
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert str(missing) in run.stdout, run.stdout
    if ci:
        assert run.returncode != 0, run.stdout
        assert "ERROR collecting test_needs_fixtures.py" in run.stdout, run.stdout
    else:
        assert run.returncode == 0 and "1 passed, 1 skipped" in run.stdout, run.stdout
