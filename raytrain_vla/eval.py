"""`python -m raytrain_vla.eval POLICY_DIR [--env demo|metaworld] [--episodes N] [--seed S]
[--n-action-steps K] ...`: closed-loop success of a policy next to baselines.

- `--env demo` (default): the demo task, next to a random and an instruction-blind baseline;
  a policy trained on a mixture is scored as its robot `--embodiment NAME`.
- `--env metaworld`: Meta-World tasks (`--tasks mt10|mt50|GROUP|NAME,...`, `--episodes` per
  task) in parallel Ray actors, next to random actions and the scripted expert; success per
  task and by difficulty group, and mp4s of the policy's first `--record` episodes per task
  in `--out`. Needs the metaworld extra.

Prints one JSON line with each controller's scores.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from raytrain_vla import policy as policy_lib
from raytrain_vla.cli import fail
from raytrain_vla.common.location import is_uri

# What the Meta-World flags mean when not given (they are refused with --env demo).
METAWORLD_DEFAULTS = {
    "tasks": "mt10", "max_steps": 500, "workers": 2, "record": 1, "out": None,
    "no_baselines": False,
}  # fmt: skip


def _path(text: str) -> Path | str:
    """A URI stays a string (`Path` would fold its `//`); `policy.load` downloads it."""
    return text if is_uri(text) else Path(text)


def _demo(args: argparse.Namespace) -> int:
    from raytrain_vla.sim.closed_loop import evaluate

    try:
        policy = policy_lib.load(
            args.policy_dir, seed=args.seed, n_action_steps=args.n_action_steps
        )
        if args.embodiment is not None or policy.meta.embodiments:
            policy.meta.embodiment(args.embodiment)  # a missing or unknown name: one line
            policy = policy.for_embodiment(args.embodiment)
    except (FileNotFoundError, ValueError) as err:
        return fail(err, 1)
    results = evaluate(policy, args.episodes, args.seed)
    print(json.dumps({r.name: r.to_dict() for r in results}))
    return 0


def _metaworld(args: argparse.Namespace) -> int:
    """Everything is checked (tasks, extra installed, policy shapes, output) before Ray starts."""
    from raytrain_vla.common.metaworld_tasks import check_max_steps, resolve_tasks
    from raytrain_vla.sim import metaworld_eval as mwe
    from raytrain_vla.sim.metaworld_env import require_metaworld

    try:
        tasks = resolve_tasks(args.tasks)
        require_metaworld()
        check_max_steps(args.max_steps, "--max-steps")
        make_policy = functools.partial(
            policy_lib.load, args.policy_dir, seed=args.seed, n_action_steps=args.n_action_steps
        )
        image_size = mwe.policy_image_size(make_policy().meta.data_spec)
        out = Path(args.out) if args.out else None
        if out is not None and out.exists() and any(out.iterdir()):
            raise FileExistsError(f"--out {out} exists and is not empty; refusing to overwrite it")
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as err:
        return fail(err, 1)
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    controllers = ("policy",) if args.no_baselines else mwe.CONTROLLERS
    scores, recorded = mwe.evaluate_metaworld(
        make_policy, tasks, args.episodes, args.seed, image_size, controllers,
        args.max_steps, args.record if out else 0, args.workers,
    )  # fmt: skip
    line = mwe.scores_json(
        scores, tasks=tasks, seed=args.seed, max_steps=args.max_steps,
        n_action_steps=args.n_action_steps, policy_dir=str(args.policy_dir),
    )  # fmt: skip
    if out is not None:
        from raytrain_vla.train.metrics import write_rollouts

        write_rollouts(out / "rollouts", recorded)
        (out / "scores.json").write_text(line + "\n")
    print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.eval", description=__doc__)
    parser.add_argument("policy_dir", type=_path, help="a policy directory, or its URI")
    parser.add_argument("--env", choices=["demo", "metaworld"], default="demo")
    parser.add_argument("--episodes", type=int, default=None, help="demo: 50; metaworld: 10 a task")
    parser.add_argument("--seed", type=int, default=1000, help="scenes differ from training's")
    parser.add_argument("--n-action-steps", type=int, default=0, help="0: the whole chunk")
    parser.add_argument("--embodiment", default=None, help="demo: a mixture policy's robot")
    mw = parser.add_argument_group("metaworld (refused with --env demo)")
    mw.add_argument("--tasks", help="mt10 (default), mt50, a group, or task names")
    mw.add_argument("--max-steps", type=int, help="LeRobot's step limit (default 500)")
    mw.add_argument("--workers", type=int, help="Ray actors running episodes (default 2)")
    mw.add_argument("--record", type=int, help="mp4s of the first N episodes a task (1; --out)")
    mw.add_argument("--out", help="scores.json and rollouts/*.mp4 (new or empty)")
    mw.add_argument("--no-baselines", action="store_true", default=None, help="no random/expert")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    given = [k for k in METAWORLD_DEFAULTS if getattr(args, k) is not None]
    if args.env == "demo" and given:
        return fail(f"--{given[0].replace('_', '-')} applies to --env metaworld only", 2)
    if args.env == "metaworld" and args.embodiment is not None:
        return fail("--embodiment applies to --env demo only", 2)
    if args.record is not None and args.out is None:
        return fail("--record writes mp4s into --out: give --out DIR", 2)
    for key, default in METAWORLD_DEFAULTS.items():
        setattr(args, key, default if getattr(args, key) is None else getattr(args, key))
    if args.episodes is None:
        args.episodes = 50 if args.env == "demo" else 10
    if args.episodes < 1 or args.workers < 1 or args.record < 0:
        return fail("--episodes and --workers must be at least 1, --record at least 0", 2)
    return _metaworld(args) if args.env == "metaworld" else _demo(args)


if __name__ == "__main__":
    sys.exit(main())
