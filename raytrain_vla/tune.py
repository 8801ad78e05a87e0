"""`python -m raytrain_vla.tune --space tune_spaces/NAME.yaml [--name SWEEP] [--config CFG.yaml]
[--dotted.key=value ...]`: sweep config keys with Ray Tune, each trial a full training run.

Writes `<ray.storage_path>/<name>/`: `results.csv`, `best_config.yaml` (ready for
`python -m raytrain_vla.run --config ...`), `best_policy/` and one Train run per trial under
`trials/`. Re-running the same name continues the sweep; finished trials are not run again.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path

from raytrain_vla.config import ConfigError, absolute_paths, dataset_configs, parse_cli
from raytrain_vla.config.help import format_config_help, wants_help
from raytrain_vla.config.parse import command_line_keys

USAGE = "python -m raytrain_vla.tune --space SPACE.yaml [--name SWEEP] [--config CFG.yaml] [--KEY=VALUE ...]"
OPTIONS = [
    ("--space PATH", "a space file, e.g. tune_spaces/full.yaml (required)"),
    ("--name SWEEP", "sweep name (default: the space file's stem); the same name continues it"),
]


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"{message} (see --help)")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = _OneLineErrors(prog="python -m raytrain_vla.tune", add_help=False)
    parser.add_argument("--space", required=True)
    parser.add_argument("--name", default="")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(format_config_help(USAGE, __doc__ or "", OPTIONS), end="")
        return 0
    try:
        args, rest = parse_args(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Imported here so `--help` and config errors answer without importing Ray Tune.
    from raytrain_vla.models.checks import check_model_options
    from raytrain_vla.train.preflight import check_before_ray
    from raytrain_vla.tuning.space import load_space

    try:
        base = absolute_paths(parse_cli(rest))
        check_model_options(base.model, base.optimizer)
        space = load_space(args.space, base, command_line_keys(rest))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for note in space.replaced_by_command_line:
        print(f"note: {note}")
    from raytrain_vla.common.run_storage import run_path

    sweep_dir = run_path(base.ray.storage_path) / (args.name or Path(args.space).stem)

    from raytrain_vla.data.demo import ensure_dataset
    from raytrain_vla.train.driver_lock import driver_lock
    from raytrain_vla.tuning import sweep

    try:
        for one in dataset_configs(base.data):
            ensure_dataset(one)
        check_before_ray(base)  # before the sweep directory is written
        with driver_lock(sweep_dir, "sweep driver"):
            sweep.record_sweep(sweep_dir, space, base)
            return _sweep(space, base, sweep_dir)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


def _sweep(space, base, sweep_dir: Path) -> int:
    from raytrain_vla.train.launch import init_ray
    from raytrain_vla.tuning import sweep

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # one status table, not per-trial logs
    init_ray(base, max_concurrent_trials=space.max_concurrent_trials)
    try:
        tuner = sweep.build_tuner(space, base, sweep_dir)
        grid = tuner.fit()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = sweep.results_table(grid, space, base)
    print(sweep.format_table(rows))
    csv_path = sweep.write_results(rows, sweep_dir)
    print(f"results: {csv_path}")
    best = sweep.best_row(rows, space)
    if best is None:
        print(
            f"error: no trial of sweep '{sweep_dir.name}' finished without error; no "
            "best_config.yaml written (see the error column and the trials' logs)",
            file=sys.stderr,
        )
        return 1
    best_path, info = sweep.write_best(best, space, base, sweep_dir)
    print(f"best config: {best_path}\nbest policy: {info['export']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
