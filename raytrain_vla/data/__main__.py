"""`python -m raytrain_vla.data demo OUT` writes the demo dataset; `inspect ROOT` summarises one.

Thin on purpose: the work lives in demo.py and lerobot.py. Expected failures print one
`error: ...` line and exit 1, so scripts and CI logs show the cause rather than a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

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
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (DatasetError, FileExistsError, VideoDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
