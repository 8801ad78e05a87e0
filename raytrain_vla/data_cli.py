"""`raytrain-vla data` (`python -m raytrain_vla.data`): `demo OUT` writes the demo dataset;
`inspect ROOT` summarises one; `preflight ROOT [--config CFG] [--KEY=VALUE ...]` checks it
against a run's config.

Thin on purpose: the work lives in demo.py and lerobot.py. Expected failures print one
`error: ...` line and exit 1, so scripts and CI logs show the cause rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

from raytrain_vla.cli import fail
from raytrain_vla.config import ConfigError
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.data.formats.video import VideoDecodeError


def _demo(args: argparse.Namespace) -> None:
    from raytrain_vla.data.demo import write_demo_dataset

    start = time.perf_counter()
    root = write_demo_dataset(args.out, args.episodes, seed=args.seed)
    meta = LeRobotMeta.load(root)
    print(
        f"wrote {root}: {meta.num_episodes} episodes, {meta.total_frames} frames, "
        f"{len(meta.tasks)} tasks in {time.perf_counter() - start:.1f}s"
    )


def _metaworld(args: argparse.Namespace) -> None:
    """Meta-World roll-outs (the expert's, or a policy's labelled by the expert) with each
    task's success rate."""
    from raytrain_vla.data.metaworld_demos import OnPolicy, write_metaworld_dataset

    for flag, value in (("--n-action-steps", args.n_action_steps),
                        ("--policy-max-steps", args.policy_max_steps)):  # fmt: skip
        if args.policy is None and value is not None:
            raise ValueError(f"{flag} applies with --policy only")
    on_policy = None
    if args.policy:
        import functools

        from raytrain_vla import policy as policy_lib
        from raytrain_vla.sim.metaworld_eval import policy_image_size

        make_policy = functools.partial(
            policy_lib.load, args.policy, seed=args.seed, n_action_steps=args.n_action_steps
        )
        policy_image_size(make_policy().meta.data_spec)  # one camera, 4-D: checked before Ray
        on_policy = OnPolicy(args.policy, args.n_action_steps, make_policy, args.policy_max_steps)
    start = time.perf_counter()
    root, report = write_metaworld_dataset(
        args.out, args.tasks, args.episodes_per_task, args.image_size, args.seed,
        args.max_steps, args.layout, args.base, on_policy,
    )  # fmt: skip
    for task, r in report.items():
        if on_policy is None:
            what = f"kept {r['episodes']:>4} of {r['attempts']:>4} expert episodes"
            rate = r["expert_success_rate"]
        else:
            what, rate = (
                f"{r['episodes']:>4} policy episodes labelled by the expert",
                r["policy_success_rate"],
            )
        print(f"  {task:<28} {what} (success {rate:.0%})")
    meta = LeRobotMeta.load(root)
    print(
        f"wrote {root}: {meta.num_episodes} episodes, {meta.total_frames} frames, "
        f"{len(meta.tasks)} tasks in {time.perf_counter() - start:.1f}s"
    )


def _inspect(args: argparse.Namespace) -> None:
    """Summary, then every problem found (one per line, exit status 1) or 'no problems found'."""
    from raytrain_vla.data.inspect import find_problems, summary

    print("\n".join(summary(LeRobotMeta.load(args.root))))
    problems = find_problems(args.root)
    if not problems:
        print("no problems found")
        return
    print(f"{len(problems)} problem(s):")
    for problem in problems:
        print(f"  {problem}")
    raise SystemExit(1)


def _stats(args: argparse.Namespace) -> None:
    from raytrain_vla.data.stats import write_stats

    path, written = write_stats(args.root, force=args.force)
    print(f"{'wrote' if written else 'up to date (use --force to recompute)'}: {path}")


def _convert(args: argparse.Namespace) -> None:
    from raytrain_vla.data.formats.shards import convert_to_shards

    start = time.perf_counter()
    m = convert_to_shards(
        args.root, args.out, args.chunk_size, args.image_format, args.samples_per_shard
    )
    print(
        f"wrote {args.out}: {m['num_samples']} samples in {len(m['shards'])} shard(s), "
        f"{m['image_format']} images, chunk_size {m['chunk_size']} "
        f"in {time.perf_counter() - start:.1f}s"
    )


def _preflight(args: argparse.Namespace, overrides: list[str]) -> int:
    """The run's own checks against this dataset or mixture (what `run` checks before Ray
    starts), then `inspect`'s full pass on each dataset; exit status 1 if anything is an error.
    Without ROOT, the config and overrides name the data (`data.root` or `data.mixture`)."""
    from raytrain_vla.config import absolute_paths, dataset_configs, load_config
    from raytrain_vla.data.inspect import find_problems
    from raytrain_vla.models.checks import check_model_options
    from raytrain_vla.train.preflight import Finding, preflight

    if args.root.startswith("--"):  # argparse takes an override holding a space for ROOT
        overrides, args.root = [args.root, *overrides], ""
    root = [f"--data.root={args.root}"] if args.root else []
    cfg = absolute_paths(load_config(args.config, [*overrides, *root]))
    check_model_options(cfg.model, cfg.optimizer)
    findings = preflight(cfg)
    seen = {f.message for f in findings}
    names = [e.name for e in cfg.data.mixture] or [""]
    for name, data in zip(names, dataset_configs(cfg.data), strict=True):
        where = f"data.mixture {name!r}: " if name else ""
        problems = (f"{where}{p}" for p in find_problems(data.root))
        findings += [Finding("error", p) for p in problems if p not in seen]
    for finding in findings:
        print(finding)
    errors = sum(f.level == "error" for f in findings)
    print(f"{errors} error(s), {sum(f.level == 'warning' for f in findings)} warning(s)")
    return 1 if errors else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="write the simulated reaching demo as a LeRobot v3.0 dataset"
    )
    demo.add_argument("out", help="output directory (must not exist, or be empty)")
    demo.add_argument("--episodes", type=_positive, default=1500)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    metaworld = sub.add_parser(
        "metaworld",
        help="write Meta-World's scripted experts as a LeRobot v3.0 dataset (successful "
        "episodes only; needs the metaworld extra)",
    )
    metaworld.add_argument("out", help="output directory (must not exist, or be empty)")
    metaworld.add_argument(
        "--tasks", default="mt10", help="mt10, mt50, easy|medium|hard|very_hard, or task names"
    )
    metaworld.add_argument("--episodes-per-task", type=_positive, default=50)
    metaworld.add_argument(
        "--image-size",
        type=_positive,
        default=None,
        help="frame size in px (default 128; 480 with --layout lerobot)",
    )
    metaworld.add_argument(
        "--layout",
        choices=["ours", "lerobot"],
        default=None,
        help="ours (default): one mp4 camera, clipped actions; lerobot: lerobot/metaworld_mt50's "
        "layout (PNG frames, environment state, reward, success, task_id, unclipped actions)",
    )
    metaworld.add_argument("--seed", type=int, default=0, help="episode k resets with seed + k")
    metaworld.add_argument("--max-steps", type=_positive, default=None, help="default 500")
    metaworld.add_argument(
        "--base",
        default=None,
        help="a dataset `data metaworld` wrote: its episodes come first, and its layout, image "
        "size and step limit apply (to add demos, or on-policy episodes for DAgger)",
    )
    metaworld.add_argument(
        "--policy",
        default=None,
        help="an exported policy that drives while the expert labels each state it reaches "
        "(DAgger); every episode is kept",
    )
    metaworld.add_argument(
        "--n-action-steps", type=_positive, default=None, help="--policy: replan every K actions"
    )
    metaworld.add_argument(
        "--policy-max-steps",
        type=_positive,
        default=None,
        help="--policy: cut each episode after N steps (default: the step limit); the data "
        "keeps the dataset's step limit",
    )
    metaworld.set_defaults(func=_metaworld)
    stats = sub.add_parser("stats", help="compute meta/stats.json with Ray Data")
    stats.add_argument("root", help="LeRobot dataset root")
    stats.add_argument("--force", action="store_true", help="recompute even if stats exist")
    stats.set_defaults(func=_stats)
    convert = sub.add_parser("convert", help="precompute Arrow/Parquet shards (Ray Data job)")
    convert.add_argument("root", help="LeRobot dataset root")
    convert.add_argument("out", help="shards directory (must not exist, or be empty)")
    convert.add_argument("--chunk-size", type=_positive, default=8)
    convert.add_argument("--image-format", choices=["raw", "png"], default="raw")
    convert.add_argument("--samples-per-shard", type=_positive, default=4096)
    convert.set_defaults(func=_convert)
    inspect = sub.add_parser("inspect", help="summarise a LeRobot dataset")
    inspect.add_argument("root")
    inspect.set_defaults(func=_inspect)
    preflight = sub.add_parser(
        "preflight",
        help="check a dataset against a run's config before training (what the model sees, "
        "text budget, short episodes, files, statistics); extra --KEY=VALUE are config overrides",
    )
    preflight.add_argument(
        "root", nargs="?", default="",
        help="LeRobot dataset root; leave it out for the config's data.root or data.mixture",
    )  # fmt: skip
    preflight.add_argument("--config", default=None, help="the run's config file")
    preflight.set_defaults(func=_preflight)
    args, overrides = parser.parse_known_args(argv)
    if overrides and args.func is not _preflight:
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    try:
        if args.func is _preflight:
            return args.func(args, overrides)
        args.func(args)
    except ConfigError as err:
        return fail(err, 2)
    except (
        DatasetError,
        FileExistsError,
        FileNotFoundError,
        VideoDecodeError,
        ImportError,
        ValueError,
        RuntimeError,
    ) as err:
        return fail(err, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
