"""The README's commands that run on one machine, run as the README writes them: placeholders
(OUT, ROOT, checkpoint_...) filled in, optional [...] parts left out, and sizes cut to a test's
budget. A command changed in the README without changing it here fails the first assertion.

The cluster commands are checked against `cluster.yaml` (tests/unit/test_cluster_yaml.py), the
training and sweep commands' keys by tests/unit/test_readme_commands.py, the "own robot" block
by test_new_user.py, `make test`/`make lint` by `.ci/run`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from raytrain_vla import eval as eval_cli
from raytrain_vla import export as export_cli
from raytrain_vla import report as report_cli
from raytrain_vla import run as run_cli
from raytrain_vla.config import data_root
from raytrain_vla.data_cli import main as data_cli

pytestmark = pytest.mark.usefixtures("ray_cluster")
README = Path(__file__).resolve().parents[2] / "README.md"
MAINS = {
    "raytrain_vla.data": data_cli,
    "raytrain_vla.export": export_cli.main,
    "raytrain_vla.eval": eval_cli.main,
    "raytrain_vla.report": report_cli.main,
}


def readme_lines() -> set[str]:
    """Every command line of the README's bash blocks, comments and [optional] parts removed."""
    lines = set()
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s*\[[^\]]*\]", "", line.split(" #", 1)[0]).strip()
            lines.add(" ".join(line.split()))
    return lines


def run_readme(line: str, fill: dict[str, str]) -> int:
    assert line in readme_lines(), f"the README no longer has: {line}"
    words = shlex.split(line)
    assert words[:2] == ["python", "-m"], line
    args = [fill.get(w, w) for w in words[3:]]
    return MAINS[words[2]](args)


def test_the_readmes_data_export_eval_and_report_commands_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data_root, "DEMO_CACHE", tmp_path / "cache")
    demo, shards = tmp_path / "demo", tmp_path / "shards"
    assert (
        run_readme(
            "python -m raytrain_vla.data demo OUT --episodes 1500", {"OUT": str(demo), "1500": "24"}
        )
        == 0
    )
    assert run_readme("python -m raytrain_vla.data inspect ROOT", {"ROOT": str(demo)}) == 0
    assert "no problems found" in capsys.readouterr().out
    assert run_readme("python -m raytrain_vla.data preflight ROOT", {"ROOT": str(demo)}) == 0
    assert "0 error(s)" in capsys.readouterr().out
    assert run_readme("python -m raytrain_vla.data stats ROOT", {"ROOT": str(demo)}) == 0
    assert (
        run_readme(
            "python -m raytrain_vla.data convert ROOT OUT", {"ROOT": str(demo), "OUT": str(shards)}
        )
        == 0
    )
    assert (shards / "shards.json").is_file()
    mixture = f"--data.mixture=[{{root: {demo}, weight: 2}}, {{root: {shards}, name: shards}}]"
    line = "python -m raytrain_vla.data preflight --data.mixture=MIXTURE"
    assert run_readme(line, {"--data.mixture=MIXTURE": mixture}) == 0
    out = capsys.readouterr().out
    assert "0 error(s)" in out, out

    # `make run` in small: the default config (data.root=demo writes the demo on first use).
    runs = tmp_path / "runs"
    short = ["--data.demo_episodes=24", "--train.steps=4", "--train.global_batch_size=16"]
    short += ["--train.micro_batch_size=8", "--train.val_interval=4", "--eval.episodes=2"]
    short += [f"--ray.storage_path={runs}", "--logging.wandb_mode=disabled"]
    assert run_cli.main(short) == 0
    assert (tmp_path / "cache" / "demo_v1_24ep_seed0" / "meta" / "info.json").is_file()
    checkpoint = max(p for p in (runs / "demo").glob("checkpoint_*") if p.is_dir())
    monkeypatch.chdir(tmp_path)  # the README's paths are relative: runs/demo/...
    fill = {"runs/demo/checkpoint_...": str(checkpoint), "OUT": str(tmp_path / "exported")}
    assert run_readme("python -m raytrain_vla.export runs/demo/checkpoint_... OUT", fill) == 0
    assert (tmp_path / "exported" / "model.safetensors").is_file()
    assert (
        run_readme("python -m raytrain_vla.eval runs/demo/export --episodes 50", {"50": "2"}) == 0
    )
    assert '"policy"' in capsys.readouterr().out
    assert run_readme("python -m raytrain_vla.report runs/demo", {}) == 0
    assert (runs / "demo" / "report" / "training.png").is_file()
