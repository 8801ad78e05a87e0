"""Video data throughput: our Ray Data pipeline vs a LeRobot-style DataLoader vs raw decoding.

On a cached, LeRobot-encoded dataset (2 cameras, AV1 GOP 2 crf 30 by default, plus an h264
variant with a long GOP), one run measures side by side:

1. ours: the training plan for one rank through `iter_rank_batches(LeRobotSource(...))`;
2. baseline: a shuffled torch DataLoader that opens, seeks and decodes every camera per sample
   (LeRobot's access pattern), with as many workers as the pipeline gets CPUs;
3. raw: one process decoding the same video files sequentially to RGB (the decoder's ceiling:
   the better of PyAV's defaults and single-threaded decoder + swscale, which is faster here);
4. resume: time to the first batch when the work list starts at 90% of an epoch vs at 0%.

It prints one JSON object with every figure and the ratios ours/baseline, ours/raw and
resume90/resume0 per variant (targets: >= 5, >= 0.5, <= 1.2). Absolute rates depend on the
machine and its load; the ratios are the result.

`ours` drives the pipeline exactly as training does: `rank_read_tasks` with the default
`DataConfig` (read tasks end on shuffle-window boundaries, at most `samples_per_read_task`
samples and `read_task_max_mb` of decoded frames, 4 tasks per segment). `ours_fixed_512` is the
cut used before (fixed 512-sample tasks), side by side. `--realistic av1,h264` adds datasets
with two 480x640 cameras resized to 224x224 in the read task: `ours` resizes each frame as it
is decoded and caps tasks by the resized bytes (training's default for a processor with a
`frame_size`); `ours_resize_after_decode` holds the native frames and resizes them after, as
before, side by side; `ours_whole_first_task` decodes a whole first segment of full tasks
before the first batch, as before the stream's first task was cut to 1/8 and decoded alone.
`--s3` serves the same files from a local S3 server (moto) and adds
`ours_s3` with its ratio to `ours`.

    python benchmarks/data_throughput.py --num-cpus 2 --epochs 2 [--realistic av1,h264] [--s3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import av
import numpy as np

from raytrain_vla.config.schema import DataConfig
from raytrain_vla.data.formats.writer import (
    DatasetSpec,
    EpisodeData,
    VideoSpec,
    write_lerobot_dataset,
)

CAMERAS = ("observation.images.front", "observation.images.wrist")
VARIANTS = {
    "av1": VideoSpec("libsvtav1", crf=30, gop=2, preset=12),  # LeRobot's default encoding
    "h264": VideoSpec("libx264", crf=23, gop=30, preset="veryfast"),
}
TASKS = ("pick the cube", "push the block left", "open the drawer", "stack the cups")


# ---------------------------------------------------------------- dataset -----------------------
def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A smooth random colour field (sum of random sinusoids): compressible but not flat."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    img = np.zeros((size, size, 3), np.float32)
    for _ in range(6):
        fx, fy = rng.uniform(-6, 6, 2)
        img += np.sin(2 * np.pi * (fx * x + fy * y) + rng.uniform(0, 6.3))[..., None] * rng.uniform(
            10, 30, 3
        )
    return np.clip(img + 110, 0, 255)


def render_episode(
    rng: np.random.Generator, frames: int, size: int, width: int | None = None
) -> EpisodeData:
    """Two cameras (size x width) over a panning textured scene with three moving discs and an
    arm tip."""
    height, width = size, width or size
    t = np.arange(frames, dtype=np.float32)[:, None]
    freq, phase = rng.uniform(0.01, 0.05, (2, 8)), rng.uniform(0, 6.3, (2, 8))
    path = 0.5 + 0.35 * np.sin(freq[0] * t + phase[0])  # (T, 8): x,y of 3 discs + the tip
    path[:, 1::2] = 0.5 + 0.35 * np.cos(freq[1, 1::2] * t + phase[1, 1::2])
    colours = rng.uniform(30, 250, (4, 3))
    yx = (np.mgrid[0:height, 0:width].astype(np.float32) + 0.5) / [[[height]], [[width]]]
    cams = {}
    for c, key in enumerate(CAMERAS):
        tex = _texture(rng, 2 * max(height, width))
        pan = (height / 2 * (1 + np.sin(0.02 * (c + 1) * t[:, 0]))).astype(int)  # camera motion
        img = np.stack([tex[p // 2 : p // 2 + height, p : p + width] for p in pan])
        zoom = 1.0 + c  # the wrist camera sees the scene twice as large around the tip
        for d in range(4):
            cx, cy = path[:, 2 * d], path[:, 2 * d + 1]
            if c:
                cx, cy = 0.5 + (cx - path[:, 6]) * zoom, 0.5 + (cy - path[:, 7]) * zoom
            for i in range(frames):  # one frame at a time: (T, H, W) floats would not fit
                dist = (yx[1] - cx[i]) ** 2 + (yx[0] - cy[i]) ** 2
                img[i][dist < (0.06 * zoom) ** 2] = colours[d]
        cams[key] = img.astype(np.uint8)
    state = path[:, 6:8].repeat(3, 1).astype(np.float32)
    action = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
    return EpisodeData(cams, state, action, TASKS[int(rng.integers(len(TASKS)))])


def ensure_dataset(
    cache: Path, variant: str, episodes: int, frames: int, size: int, fps: int,
    width: int | None = None,
):  # fmt: skip
    """The variant's dataset under `cache`, written once (deterministic content, seed 0)."""
    shape = f"s{size}" if width is None else f"s{size}x{width}"
    root = cache / f"{variant}_e{episodes}_f{frames}_{shape}_fps{fps}"
    if (root / "meta" / "info.json").is_file():
        return root
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints a banner per file otherwise
    rng = np.random.default_rng(0)
    eps = [render_episode(rng, frames, size, width) for _ in range(episodes)]
    spec = DatasetSpec(fps, VARIANTS[variant], robot_type="bench_synthetic")
    return write_lerobot_dataset(root, eps, spec)


# ---------------------------------------------------------------- measurements ------------------
def measure_raw(meta) -> dict:
    """One process decoding every camera file front to back into RGB arrays: the ceiling.

    Two settings: PyAV's defaults, and single-threaded decoder and swscale (faster on small
    frames); the better one is the limit.
    """
    from av.video.reformatter import VideoReformatter

    out: dict = {}
    for name, threads in (("pyav_defaults", None), ("single_thread", 1)):
        per_cam = {}
        for key in meta.video_keys:
            sws, n = VideoReformatter(), 0
            t0 = time.perf_counter()
            with av.open(str(meta.video_file(key, 0))) as container:
                stream = container.streams.video[0]
                if threads:
                    stream.codec_context.thread_count = threads
                for frame in container.decode(stream):
                    sws.reformat(frame, format="rgb24", threads=threads).to_ndarray()
                    n += 1
            per_cam[key] = n / (time.perf_counter() - t0)
        samples = 1.0 / sum(1.0 / r for r in per_cam.values())  # one frame of every camera
        out[name] = {"frames_per_s": per_cam, "samples_per_s": samples}
    out["samples_per_s"] = max(v["samples_per_s"] for v in out.values())
    return out


def _lerobot_style_frame(path: str, ts: float) -> np.ndarray:
    """LeRobot's per-item access: open, seek back to a keyframe, decode up to `ts`, keep nearest."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        container.seek(int(ts / stream.time_base), stream=stream, backward=True)
        prev = None
        for frame in container.decode(stream):
            t = float(frame.time)
            if t >= ts - 1e-6:
                if prev is not None and ts - prev[0] < t - ts:
                    frame = prev[1]
                return frame.to_ndarray(format="rgb24")
            prev = (t, frame)
    return prev[1].to_ndarray(format="rgb24")


class PerSampleDataset:
    """Map-style dataset that seeks and decodes every camera for each sample, as LeRobot does."""

    def __init__(self, source):
        self.s = source

    def __len__(self) -> int:
        return self.s.meta.total_frames

    def __getitem__(self, i: int) -> dict:
        read = self.s.reader(np.array([i]))
        cols, timestamp, _ = read.read_rows()  # parquet rows; frames below, one seek each
        item = {"sample_id": i, "state": cols["state"][0], "actions": cols["actions"][0]}
        for key in self.s.camera_keys:
            refs = read.videos[key]
            time = float(refs.offset[0] + timestamp[0])
            item[f"image/{key}"] = _lerobot_style_frame(refs.paths[refs.file[0]], time)
        return item


def measure_baseline(source, samples: int, batch: int, workers: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(
        PerSampleDataset(source),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(0),
    )
    n, t0 = 0, time.perf_counter()
    for b in loader:
        n += len(b["sample_id"])
        if n >= samples:
            break
    dt = time.perf_counter() - t0
    return {"samples": n, "seconds": dt, "samples_per_s": n / dt, "num_workers": workers}


class Setup(NamedTuple):
    """How the pipeline is driven: at most this many samples per read task, tasks per segment,
    whether tasks end on shuffle-window boundaries (training's default), and whether frames are
    resized as they are decoded (training's default when the processor has a `frame_size`), and
    whether the first task is cut small and decoded alone, beside the first full segment
    (training's default)."""

    samples_per_task: int
    tasks_per_segment: int
    follow_windows: bool
    resize_while_decoding: bool = True
    small_first_task: bool = True


class ResizeInTask:
    """Resizes every camera in the read task (what flow_vla's processor does there)."""

    def __init__(self, size: tuple[int, int] | None):
        self.size = size

    def __call__(self, cols: dict, epochs: np.ndarray) -> dict:
        if self.size is None:
            return cols
        from raytrain_vla.common.image_ops import resize_images

        images = {k: v for k, v in cols.items() if k.startswith("image/")}
        cols.pop("task", None)  # strings: not needed downstream here
        return {**cols, **resize_images(images, self.size)}


def _run_ours(source, plan, start: int, end: int, args, setup: Setup, first_only: bool = False):
    """(samples, seconds to the first batch, seconds in all) for steps [start, end)."""

    from raytrain_vla.data.pipeline import LEAD_FRACTION, iter_rank_batches
    from raytrain_vla.data.read_tasks import rank_read_tasks

    tasks = rank_read_tasks(plan, start, end, 0, 1, setup.samples_per_task, args.micro_batch,
                            setup.follow_windows)  # fmt: skip
    post = ResizeInTask(args.resize)
    frame_size = args.resize if setup.resize_while_decoding else None
    n, first, t0, seen = 0, None, time.perf_counter(), []
    for b in iter_rank_batches(
        source, tasks, args.micro_batch, tasks_per_segment=setup.tasks_per_segment, post=post,
        frame_size=frame_size, lead_fraction=LEAD_FRACTION if setup.small_first_task else 1,
    ):  # fmt: skip
        first = first if first is not None else time.perf_counter() - t0
        n += len(b["sample_id"])
        seen.append(b["sample_id"])
        if first_only:
            break
    total = time.perf_counter() - t0
    if not first_only and not np.array_equal(
        np.concatenate(seen), plan.rank_work(start, end, 0, 1)
    ):
        raise AssertionError("pipeline output is not in plan order")
    return n, first, total


def _plan(source, args):
    from raytrain_vla.data.plan import SamplePlan

    cfg = DataConfig()
    meta = source.meta
    return SamplePlan.from_runs(
        meta.episode_from_index, meta.episode_length, 0, args.global_batch, cfg.span_len,
        cfg.shuffle_window,
    )  # fmt: skip


def measure_ours(source, args, setup: Setup) -> dict:
    plan = _plan(source, args)
    steps = args.epochs * plan.steps_per_epoch
    warm = setup.samples_per_task * setup.tasks_per_segment // args.global_batch
    _run_ours(source, plan, steps, steps + warm, args, setup)  # start workers
    n, first, total = _run_ours(source, plan, 0, steps, args, setup)
    return {
        "setup": setup._asdict(),
        "samples": n,
        "seconds": total,
        "samples_per_s": n / total,
        "first_batch_s": first,
        "samples_per_s_after_first_batch": (n - args.micro_batch) / (total - first),
    }


def measure_resume(source, args, setup: Setup, repeats: int = 5) -> dict:
    """Time to the first batch from step 0 and from 90% of the epoch, same work length."""
    length = setup.samples_per_task * setup.tasks_per_segment // args.global_batch  # a segment
    out: dict[str, list[float]] = {"0": [], "90": []}
    for _ in range(repeats):
        for name in out:
            t0 = time.perf_counter()
            plan = _plan(source, args)  # fresh: the plan's epoch pass is inside the timing
            start = plan.steps_per_epoch * int(name) // 100
            planned = time.perf_counter() - t0
            _, first, _ = _run_ours(source, plan, start, start + length, args, setup, True)
            out[name].append(planned + first)
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"first_batch_s_at_0": med["0"], "first_batch_s_at_90": med["90"],
            "min_ratio": min(out["90"]) / min(out["0"]), "runs": out}  # fmt: skip


def _ratios(ours: dict, base: dict, raw: dict, resume: dict) -> dict:
    r = {
        "ours_over_baseline": ours["samples_per_s"] / base["samples_per_s"],
        "ours_over_raw": ours["samples_per_s"] / raw["samples_per_s"],
        "ours_over_raw_pyav_defaults": ours["samples_per_s"]
        / raw["pyav_defaults"]["samples_per_s"],
        "resume90_over_resume0": resume["first_batch_s_at_90"] / resume["first_batch_s_at_0"],
    }
    r["targets_met"] = {
        "ours_over_baseline>=5": r["ours_over_baseline"] >= 5,
        "ours_over_raw>=0.5": r["ours_over_raw"] >= 0.5,
        "resume90_over_resume0<=1.2": r["resume90_over_resume0"] <= 1.2,
    }
    return r


def run_variant(root: Path, args, uri: str | None = None) -> dict:
    """Every measurement on one dataset; `ours` is the pipeline exactly as training drives it.
    With `uri` (the same files on an S3 server), `ours_s3` reads them from there."""
    from raytrain_vla.data.formats.lerobot import LeRobotMeta
    from raytrain_vla.data.formats.lerobot_source import LeRobotSource
    from raytrain_vla.data.read_tasks import capped_task_size

    meta = LeRobotMeta.load(root)
    source = LeRobotSource(meta, args.chunk_size)
    info = meta.features[meta.video_keys[0]]["info"]
    out: dict = {"video": {k[6:]: info[k] for k in ("video.codec", "video.g", "video.crf")}}
    out["video"]["shape"] = list(meta.camera_shape(meta.video_keys[0]))
    out["raw"] = raw = measure_raw(meta)
    out["baseline"] = base = measure_baseline(
        source, args.baseline_samples, args.micro_batch, args.num_cpus
    )
    native_bytes = sum(int(np.prod(meta.camera_shape(k))) for k in meta.camera_keys)
    sample_bytes = native_bytes
    if args.resize is not None:  # what the task holds when it resizes while decoding
        sample_bytes = 3 * args.resize[0] * args.resize[1] * len(meta.camera_keys)
    cfg = DataConfig()

    def cap(nbytes: int) -> int:
        return capped_task_size(cfg.samples_per_read_task, cfg.read_task_max_mb, nbytes,
                                args.micro_batch)  # fmt: skip

    per_segment, windows = cfg.read_tasks_per_segment, cfg.read_tasks_follow_windows
    setups = {"ours": Setup(cap(sample_bytes), per_segment, windows)}
    if args.resize is not None:  # before: native frames held, resized after the task's decode
        setups["ours_resize_after_decode"] = Setup(cap(native_bytes), per_segment, windows, False)
        # before: the first segment of full tasks decoded before the first batch
        setups["ours_whole_first_task"] = Setup(
            cap(sample_bytes), per_segment, windows, True, False
        )
    if args.previous:  # the cut before window-aligned tasks were the default
        setups["ours_fixed_512"] = Setup(512, 4, False, False, False)
    for name, setup in setups.items():
        ours = measure_ours(source, args, setup)
        resume = measure_resume(source, args, setup)
        out[name] = {**ours, "resume": resume, "ratios": _ratios(ours, base, raw, resume)}
    if uri is not None:
        remote = LeRobotSource(LeRobotMeta.load(uri), args.chunk_size)
        ours = measure_ours(remote, args, setups["ours"])
        resume = measure_resume(remote, args, setups["ours"])
        out["ours_s3"] = {**ours, "resume": resume, "ratios": _ratios(ours, base, raw, resume)}
        out["ours_s3"]["ratios"]["s3_over_local"] = (
            ours["samples_per_s"] / out["ours"]["samples_per_s"]
        )
    return out


def _summary(res: dict) -> dict:
    out = {k: round(res[k]["samples_per_s"]) for k in ("raw", "baseline")}
    for k, r in res.items():
        if k.startswith("ours"):
            out[k] = {"samples_per_s": round(r["samples_per_s"]), **r["ratios"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="~/.cache/raytrain_vla/bench_throughput")
    p.add_argument("--variants", default="av1,h264")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--num-cpus", type=int, default=2, help="Ray CPUs = DataLoader workers")
    p.add_argument("--epochs", type=int, default=2, help="epochs of the plan that ours reads")
    p.add_argument("--baseline-samples", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--chunk-size", type=int, default=8)
    p.add_argument(
        "--realistic",
        default="",
        metavar="CODECS",
        help="also these codecs (e.g. av1,h264) at 2 x 480x640, resized to 224 in the task",
    )
    p.add_argument(
        "--s3",
        action="store_true",
        help="also read the same files from a local S3 server (moto, from .[dev])",
    )
    p.add_argument("--realistic-episodes", type=int, default=20)
    p.add_argument(
        "--no-previous",
        dest="previous",
        action="store_false",
        help="skip the side-by-side run with the previous cut (fixed 512 samples)",
    )
    args = p.parse_args()
    args.resize = None

    import ray

    cache = Path(args.cache).expanduser()
    variants = args.variants.split(",")
    roots = {
        v: ensure_dataset(cache, v, args.episodes, args.frames, args.size, args.fps)
        for v in variants
    }
    for codec in args.realistic.split(",") if args.realistic else []:
        roots[f"{codec}_480x640"] = ensure_dataset(
            cache, codec, args.realistic_episodes, args.frames, 480, args.fps, width=640
        )
        variants.append(f"{codec}_480x640")
    uris: dict[str, str] = {}
    server = None
    if args.s3:  # before Ray starts: its workers inherit the server's AWS_* variables
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from s3_server import S3Server

        server = S3Server().start()
        uris = {v: server.upload(roots[v], f"bench/{roots[v].name}") for v in variants}
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        result = {"config": {**vars(args), "cameras": list(CAMERAS), "cpu_count": os.cpu_count(),
                             "load_avg_at_start": os.getloadavg()[0]}}  # fmt: skip
        for v in variants:
            args.resize = (224, 224) if v.endswith("_480x640") else None
            result[v] = run_variant(roots[v], args, uris.get(v))
        result["config"]["load_avg_at_end"] = os.getloadavg()[0]
        result["summary"] = {v: _summary(result[v]) for v in variants}
    finally:
        ray.shutdown()
        if server is not None:
            server.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
