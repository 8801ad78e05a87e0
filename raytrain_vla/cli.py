"""`raytrain-vla COMMAND ...`: one console script over the `python -m raytrain_vla.<module>` commands.

The modules stay the entry points (`ray job submit -- python -m raytrain_vla.run ...` needs no
installed script); this only dispatches, importing just the command that runs.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module with `main(argv) -> int`, one-line meaning)
COMMANDS = {
    "train": (
        "raytrain_vla.run",
        "train, validate, export and score a policy (config keys: --help)",
    ),
    "tune": ("raytrain_vla.tune", "sweep config keys with Ray Tune"),
    "data": (
        "raytrain_vla.data_cli",
        "demo | metaworld | stats | convert | inspect | preflight a dataset",
    ),
    "export": ("raytrain_vla.export", "a policy directory from a training checkpoint"),
    "eval": (
        "raytrain_vla.eval",
        "closed-loop success of a policy: the demo simulator or Meta-World",
    ),
    "report": ("raytrain_vla.report", "PNG plots of a run"),
    "plan-memory": ("raytrain_vla.plan_memory", "per-rank memory of a run before renting GPUs"),
}


def fail(err: BaseException | str, code: int) -> int:
    """A command's refusal: one `error: ...` line on stderr, and the exit status to return."""
    print(f"error: {err}", file=sys.stderr)
    return code


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: raytrain-vla COMMAND [ARGS ...]   (COMMAND --help for its options)", ""]
    lines += [f"  {name:<{width}}  {meaning}" for name, (_, meaning) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}, expected one of {list(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
