"""Re-write a LeRobot v3.0 dataset in the v2.1 layout, for conformance tests of the v2.1 reader.

Follows LeRobot's v2.1 format: `meta/info.json` with `data_path`
`data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet` and `video_path`
`videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4`, one parquet and
one mp4 per episode (each video starts at t = 0), `tasks.jsonl`, `episodes.jsonl` and
`episodes_stats.jsonl` (per-episode min/max/mean/std/count) and no `stats.json`, so the reader
has to aggregate. Frame columns are copied verbatim. Videos are cut per episode either
losslessly (the decoded yuv420p planes re-encoded with lossless h264, so every decoded pixel is
identical and a conformance test can demand exact equality) or the way a fresh v2.1 writer
would do it, from RGB frames through `encode_video` (then pixels differ slightly at edges).
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq

from raytrain_vla.data.formats.lerobot import LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.video import decode_frames, encode_video

DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
_EPISODE_STATS = ("min", "max", "mean", "std", "count")


def write_v21_copy(
    src: str | Path, dst: str | Path, chunks_size: int = 2, lossless: bool = True
) -> Path:
    """Write the v3.0 dataset at `src` as v2.1 at `dst`; a small `chunks_size` spreads episodes
    over several chunk folders, so the chunk arithmetic is exercised too."""
    meta, dst = LeRobotMeta.load(src), Path(dst)
    stored = [k for k, f in meta.features.items() if f["dtype"] != "video"]
    hf_meta = pq.read_schema(meta.data_file(0)).metadata
    table = read_frames_table(meta, stored).select(stored).replace_schema_metadata(hf_meta)
    for e in range(meta.num_episodes):
        lo, n = int(meta.episode_from_index[e]), int(meta.episode_length[e])
        fields = {"episode_chunk": e // chunks_size, "episode_index": e}
        path = dst / DATA_PATH.format(**fields)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(lo, n), path)
        times = table["timestamp"].to_numpy()[lo : lo + n].astype(np.float64)
        for key in meta.video_keys:
            src_video, out = (
                meta.video_file(key, e),
                dst / VIDEO_PATH.format(video_key=key, **fields),
            )
            in_file = meta.video_from_timestamp(key, e) + times  # per camera: files differ
            if lossless:
                _copy_yuv(src_video, in_file, out, meta.fps)
            else:
                encode_video(out, decode_frames(src_video, in_file), meta.fps)

    info = {k: v for k, v in meta.info.items() if not k.endswith("_size_in_mb")}
    info.update(codebase_version="v2.1", data_path=DATA_PATH, chunks_size=chunks_size)
    info.update(total_chunks=(meta.num_episodes - 1) // chunks_size + 1)
    info.update(total_videos=meta.num_episodes * len(meta.video_keys))
    info["video_path"] = VIDEO_PATH if meta.video_keys else None
    (dst / "meta").mkdir(parents=True, exist_ok=True)
    (dst / "meta/info.json").write_text(json.dumps(info, indent=4))
    tasks = [{"task_index": i, "task": t} for i, t in enumerate(meta.tasks)]
    episodes = [
        {"episode_index": e, "tasks": meta.episode_tasks(e), "length": int(meta.episode_length[e])}
        for e in range(meta.num_episodes)
    ]
    _write_jsonl(dst / "meta/tasks.jsonl", tasks)
    _write_jsonl(dst / "meta/episodes.jsonl", episodes)
    _write_jsonl(dst / "meta/episodes_stats.jsonl", _episode_stats(meta))
    return dst


def _copy_yuv(src: Path, times: np.ndarray, dst: Path, fps: int) -> None:
    """The frames of `src` at `times`, as yuv420p planes, into a lossless h264 mp4 at i / fps."""
    with av.open(str(src)) as container:
        decoded = {round(float(f.time), 6): f.to_ndarray() for f in container.decode(video=0)}
    planes = [decoded[round(float(t), 6)] for t in times]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(dst), "w", format="mp4") as out:
        options = {"qp": "0", "g": "2", "bf": "0", "preset": "veryfast"}
        stream = out.add_stream("libx264", rate=fps, options=options)
        stream.height, stream.width = planes[0].shape[0] * 2 // 3, planes[0].shape[1]
        stream.pix_fmt = "yuv420p"
        for i, plane in enumerate(planes):
            frame = av.VideoFrame.from_ndarray(plane, format="yuv420p")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


def _episode_stats(meta: LeRobotMeta) -> list[dict]:
    """The v3.0 per-episode `stats/<key>/<stat>` columns as v2.1 `episodes_stats.jsonl` rows."""
    files = sorted((meta.root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    rows.sort(key=lambda r: r["episode_index"])
    out = []
    for r in rows:
        stats: dict[str, dict] = {}
        for col, value in r.items():
            parts = col.split("/")
            if parts[0] == "stats" and parts[-1] in _EPISODE_STATS:
                stats.setdefault("/".join(parts[1:-1]), {})[parts[-1]] = value
        out.append({"episode_index": r["episode_index"], "stats": stats})
    return out


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
