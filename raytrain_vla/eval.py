"""`python -m raytrain_vla.eval POLICY_DIR [--episodes N] [--seed S] [--n-action-steps K]
[--embodiment NAME]`: closed-loop success on the demo task, next to a random and an
instruction-blind baseline. A policy trained on a mixture is scored as its robot NAME.

Prints one JSON line with the success rate and mean final distance of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from raytrain_vla import policy as policy_lib
from raytrain_vla.common.location import is_uri
from raytrain_vla.sim.closed_loop import evaluate


def _path(text: str) -> Path | str:
    """A URI stays a string (`Path` would fold its `//`); `policy.load` downloads it."""
    return text if is_uri(text) else Path(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.eval", description=__doc__)
    parser.add_argument("policy_dir", type=_path, help="a policy directory, or its URI")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1000, help="scenes differ from training's")
    parser.add_argument("--n-action-steps", type=int, default=0, help="0: the whole chunk")
    parser.add_argument("--embodiment", default=None, help="a mixture policy's robot to score")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.episodes < 1:
        print("error: --episodes must be at least 1", file=sys.stderr)
        return 2
    try:
        policy = policy_lib.load(
            args.policy_dir, seed=args.seed, n_action_steps=args.n_action_steps
        )
        if args.embodiment is not None or policy.meta.embodiments:
            policy.meta.embodiment(args.embodiment)  # a missing or unknown name: one line
            policy = policy.for_embodiment(args.embodiment)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    results = evaluate(policy, args.episodes, args.seed)
    print(json.dumps({r.name: r.to_dict() for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
