"""`find_problems(root)`: every problem a cheap pass over a LeRobot dataset can find, not just the
first, so one run of `python -m raytrain_vla.data inspect ROOT` gives the whole repair list.

Cheap means: metadata, every data file read once (low-dimensional columns checked for shape,
dtype, NaN/inf, index continuity, timestamps, task ids), the first image of each episode decoded,
and each video opened and decoded only around its end (to prove it is long enough). It never
decodes whole videos; training reports a bad frame in the middle of one when it meets it.
"""

from __future__ import annotations

from pathlib import Path

import av
import av.error
import numpy as np
import pyarrow as pa

from raytrain_vla.common.location import open_container, read_schema_names, read_table
from raytrain_vla.data.formats.frame_checks import (
    describe_episodes,
    frame_problems,
    timestamp_problems,
)
from raytrain_vla.data.formats.images import decode_images
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta
from raytrain_vla.progress import progress

REQUIRED = ("timestamp", "frame_index", "episode_index", "index", "task_index")
TRAINING = ("observation.state", "action")
_STATS = ("mean", "std", "min", "max")


def find_problems(root: str | Path) -> list[str]:
    """One line per problem found; [] when the dataset looks sound."""
    try:
        meta = LeRobotMeta.load(root)
    except DatasetError as e:
        return [str(e)]  # without consistent metadata nothing else can be located
    out = _feature_problems(meta)
    if (meta.root / "shards.json").is_file():
        return out + _shard_problems(meta) + _stats_problems(meta)
    checks = [(_data_file_problems, path, eps) for path, eps in meta.data_files().items()]
    checks += [(_video_problems, key) for key in meta.video_keys]
    for check, *args in progress(checks, f"inspect {meta.root}", "check"):
        out += check(meta, *args)
    return out + _stats_problems(meta)


def quick_problems(meta: LeRobotMeta) -> list[str]:
    """What can be found without reading frames (every run checks it before Ray starts):
    features, video files that are missing, fps, statistics present and finite."""
    out = _feature_problems(meta)
    if meta.fps <= 0:
        out.append(f"{meta.root / 'meta' / 'info.json'}: fps {meta.fps}, expected > 0")
    if not (meta.root / "shards.json").is_file():
        for key in meta.video_keys:
            out += [
                _missing_video(path, key, eps)
                for path, eps in _episodes_by_video(meta, key).items()
                if not path.is_file()
            ]
    return out + _stats_problems(meta)


def _episodes_by_video(meta: LeRobotMeta, key: str) -> dict[Path, list[int]]:
    files: dict[Path, list[int]] = {}
    for e in range(meta.num_episodes):
        files.setdefault(meta.video_file(key, e), []).append(e)
    return files


def _missing_video(path: Path, key: str, episodes: list[int]) -> str:
    """The same line from the run's quick check and from `inspect`, so `preflight`, which
    prints both, says it once."""
    return f"{path}: missing video file; feature {key!r}, {describe_episodes(episodes)}"


def _shard_problems(meta: LeRobotMeta) -> list[str]:
    """A shard directory (data/arrow.py) has no data/ or videos/: check its manifest and files."""
    from raytrain_vla.data.formats.shards.manifest import load_manifest, shard_path

    try:
        manifest = load_manifest(meta.root)
    except (DatasetError, ValueError, KeyError) as e:
        return [str(e)]
    problems = []
    for entry in manifest["shards"]:
        try:
            shard_path(meta.root, entry)
        except (DatasetError, KeyError) as e:
            problems.append(str(e))
    return problems


def _feature_problems(meta: LeRobotMeta) -> list[str]:
    info = meta.root / "meta" / "info.json"
    out = [
        f"{info}: no {k!r} feature (LeRobot requires it)"
        for k in REQUIRED
        if k not in meta.features
    ]
    out += [
        f"{info}: no {k!r} feature (training needs it)" for k in TRAINING if k not in meta.features
    ]
    for key in meta.camera_keys:
        try:
            meta.camera_shape(key)
        except DatasetError as e:
            out.append(str(e))
    return out


def _data_file_problems(meta: LeRobotMeta, path: Path, eps: np.ndarray) -> list[str]:
    where = describe_episodes(eps)
    if not path.is_file():
        return [f"{path}: missing data file; in {where}"]
    try:
        present = set(read_schema_names(path))
    except (OSError, pa.ArrowException) as e:
        return [f"{path}: unreadable parquet file ({e}); in {where}"]
    wanted = [k for k, f in meta.features.items() if f["dtype"] not in ("video", "image")]
    out = [f"{path}: missing column {k!r}; in {where}" for k in wanted if k not in present]
    try:
        table = read_table(path, [k for k in wanted if k in present])
    except (OSError, pa.ArrowException) as e:
        return out + [f"{path}: unreadable parquet file ({e}); in {where}"]
    if {"index", "episode_index"} <= set(table.column_names):
        start = int(meta.episode_from_index[eps[0]])
        out += frame_problems(path, table, meta.features, eps, meta.episode_length, start)
    if out:
        return out  # later checks assume the columns are sound
    rows_ep = table["episode_index"].to_numpy()
    task = table["task_index"].to_numpy()
    for r in np.flatnonzero((task < 0) | (task >= len(meta.tasks)))[:1]:
        out.append(
            f"{path}: task_index {task[r]} is not one of the {len(meta.tasks)} tasks; "
            f"in episode {rows_ep[r]}"
        )
    out += timestamp_problems(path, table, meta.fps)
    firsts = np.unique(rows_ep, return_index=True)[1]
    for key in meta.image_keys:
        out += _image_problems(meta, path, key, firsts, rows_ep[firsts])
    return out


def _image_problems(
    meta: LeRobotMeta, path: Path, key: str, rows: np.ndarray, eps: np.ndarray
) -> list[str]:
    """Decode the first image of each episode: present, decodable, the size info.json says."""
    try:
        cells = read_table(path, [key])[key].take(rows)
        imgs = decode_images(cells, f"{path}: feature {key!r}", eps, meta.root)
    except (OSError, pa.ArrowException, KeyError) as e:
        return [f"{path}: cannot read image column {key!r} ({e}); in {describe_episodes(eps)}"]
    except DatasetError as e:
        return [str(e)]
    _, h, w = meta.camera_shape(key)
    if imgs.shape[1:3] != (h, w):
        return [f"{path}: feature {key!r} images are {imgs.shape[1:3]}, info.json says {(h, w)}"]
    return []


def _video_problems(meta: LeRobotMeta, key: str) -> list[str]:
    files = _episodes_by_video(meta, key)
    end = meta.episodes[f"videos/{key}/to_timestamp"]
    out = []
    for path, eps in files.items():
        where = f"feature {key!r}, {describe_episodes(eps)}"
        if not path.is_file():
            out.append(_missing_video(path, key, eps))
            continue
        try:
            last, size = _video_end(path)
        except (av.error.FFmpegError, OSError, EOFError, ValueError) as e:
            out.append(f"{path}: cannot decode video ({type(e).__name__}: {e}); {where}")
            continue
        need = np.asarray(end)[eps] - 1 / meta.fps  # time of each episode's last frame
        short = np.asarray(eps)[need > last + 0.5 / meta.fps]
        if len(short):
            out.append(
                f"{path}: video ends at {last:.4g}s, before the last frame of "
                f"{describe_episodes(short)} ({need.max():.4g}s); feature {key!r}"
            )
        _, h, w = meta.camera_shape(key)
        if size != (h, w):
            out.append(f"{path}: frames are {size}, info.json says {(h, w)}; {where}")
    return out


def _video_end(path: Path) -> tuple[float, tuple[int, int]]:
    """(time of the last decodable frame, (H, W)), decoding only from the last keyframe on."""
    with open_container(path) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        if stream.duration:
            container.seek(int(stream.duration), stream=stream, backward=True, any_frame=False)
        times = [
            float(f.pts * stream.time_base) for f in container.decode(stream) if f.pts is not None
        ]
        if not times:
            raise ValueError("no frame decodes")
        return max(times), (stream.codec_context.height, stream.codec_context.width)


def _stats_problems(meta: LeRobotMeta) -> list[str]:
    where = (
        meta.root / "meta" / ("stats.json" if meta.version != "v2.1" else "episodes_stats.jsonl")
    )
    if not meta.stats:
        return [f"{where}: no statistics (normalisation needs them)"]
    out = []
    for key in [k for k in (*TRAINING, *meta.camera_keys) if k in meta.features]:
        stats = meta.stats.get(key)
        missing = [s for s in _STATS if stats is None or s not in stats]
        if missing:
            out.append(f"{where}: feature {key!r} has no {'/'.join(missing)} statistics")
            continue
        size = 3 if key in meta.camera_keys else int(np.prod(meta.features[key]["shape"]))
        for s in _STATS:
            value = np.asarray(stats[s], dtype=np.float64)
            if value.size != size:
                out.append(f"{where}: {key!r} {s} has {value.size} values, expected {size}")
            elif not np.isfinite(value).all():
                out.append(f"{where}: {key!r} {s} is not finite ({value.tolist()})")
    return out


def summary(meta: LeRobotMeta) -> list[str]:
    """The lines `inspect` prints before its problem list."""

    def shape(key: str) -> str:
        try:
            return f"CHW {meta.camera_shape(key)}"
        except DatasetError:
            return f"shape {meta.features[key]['shape']}?"

    cams = [f"{k} ({meta.features[k]['dtype']}, {shape(k)})" for k in meta.camera_keys]
    lines = [
        f"root: {meta.root}",
        f"version: {meta.version}  fps: {meta.fps}",
        f"episodes: {meta.num_episodes}  frames: {meta.total_frames}  tasks: {len(meta.tasks)}",
        f"camera keys: {', '.join(cams) or '-'}",
        f"stats: {', '.join(meta.stats) or '-'}",
        "features:",
    ]
    return lines + [f"  {k:<28} {f['dtype']:<8} {f['shape']}" for k, f in meta.features.items()]
