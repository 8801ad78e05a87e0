"""What an outside user installs: a console script per command, every third-party module the
package imports declared as a dependency, a license."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

import raytrain_vla
from raytrain_vla import cli

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(raytrain_vla.__file__).parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirement_names(specs: list[str]) -> set[str]:
    return {
        re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs
    }


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> the first file that imports it (top level or inside a function)."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "raytrain_vla":
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_imported_third_party_module_is_a_declared_dependency():
    """`pillow` was imported (PIL, for rollout strips) but not declared."""
    project = PYPROJECT["project"]
    declared = _requirement_names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared |= _requirement_names(extra)
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module, where in _third_party_imports().items():
        dists = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        if not dists & declared:
            missing.append(f"{module} ({where}; distribution {sorted(dists)})")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_one_console_script_reaches_every_command(capsys):
    assert PYPROJECT["project"]["scripts"] == {"raytrain-vla": "raytrain_vla.cli:main"}
    assert cli.main([]) == 2 and "train" in capsys.readouterr().out
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as stop:  # argparse's --help exits 0
            if cli.main([name, "--help"]) == 0:
                raise SystemExit(0)
        assert stop.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_the_license_is_declared_and_shipped():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]


def test_the_installed_console_script_runs():
    import subprocess

    script = Path(sys.executable).parent / "raytrain-vla"
    assert script.is_file(), f"{script}: not installed (pip install -e . writes it)"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert all(name in out.stdout for name in cli.COMMANDS)
