"""The README's training and sweep commands are accepted as written (keys, values, batch layout
for every world size of an elastic range). The cluster job is checked in test_cluster_yaml.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from raytrain_vla.config import parse_cli
from raytrain_vla.config.parse import command_line_keys
from raytrain_vla.tuning.space import load_space

README = Path(__file__).resolve().parents[2] / "README.md"


def _commands(module: str, command: str) -> list[list[str]]:
    """Arguments of every `python -m raytrain_vla.<module>` or `raytrain-vla <command>` line in
    the README's bash blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" #", 1)[0])
            if f"raytrain_vla.{module}" in words:
                out.append(words[words.index(f"raytrain_vla.{module}") + 1 :])
            elif words[:2] == ["raytrain-vla", command]:
                out.append(words[2:])
    return out


def _without_user_files(args: list[str]) -> list[str]:
    """CFG.yaml and a sweep's best_config.yaml are the user's files: check the rest. The
    shipped examples are checked as they are."""
    if "--config" in args:
        i = args.index("--config")
        shipped = (README.parent / args[i + 1]).is_file() and args[i + 1].startswith("examples/")
        args = (
            args[:i]
            + (["--config", str(README.parent / args[i + 1])] if shipped else [])
            + args[i + 2 :]
        )
    return [a for a in args if a not in ("--help", "-h")]


RUNS = _commands("run", "train")
TUNES = _commands("tune", "tune")
PLANS = _commands("plan_memory", "plan-memory")


def test_the_readme_has_commands_to_check():
    assert len(RUNS) >= 3 and len(TUNES) >= 3 and len(PLANS) >= 1


@pytest.mark.parametrize("args", RUNS, ids=lambda a: " ".join(a)[:60])
def test_each_readme_training_command_is_accepted(args):
    parse_cli(_without_user_files(args))  # raises ConfigError naming the key


@pytest.mark.parametrize("args", PLANS, ids=lambda a: " ".join(a)[:60])
def test_each_readme_memory_plan_command_is_accepted(args):
    from raytrain_vla.plan_memory import parse_args

    _own, rest = parse_args(_without_user_files(args))
    parse_cli(rest)


@pytest.mark.parametrize("args", TUNES, ids=lambda a: " ".join(a)[:60])
def test_each_readme_sweep_command_is_accepted(args):
    space = args[args.index("--space") + 1]
    rest = [a for a in args if a not in ("--space", space)]
    if "--name" in rest:
        i = rest.index("--name")
        rest = rest[:i] + rest[i + 2 :]
    base = parse_cli(rest)
    load_space(Path(README.parent, space), base, command_line_keys(rest))
