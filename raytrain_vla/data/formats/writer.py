"""Write episodes as a LeRobot v3.0 dataset: any cameras, image size, codec, GOP and crf, as
videos or as PNG cells in the data files, plus any further per-frame columns.

The layout, column names, dtypes and nesting follow what LeRobot 0.6 itself writes (the tests
compare against datasets LeRobot 0.6.1 wrote), so the same files load in LeRobot and here.
`DatasetWriter` takes one episode at a time and writes it out at once (frames into the open
video and parquet files, which roll over at LeRobot's file sizes), so a writer holds one episode,
never the dataset. The dataset is built in a hidden sibling directory and renamed into place
when it is closed, so an interrupted write never leaves a half dataset behind and an existing
dataset is never overwritten.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.common.atomic import atomic_directory, refuse_non_empty
from raytrain_vla.data.formats.video import PIX_FMT, VideoEncoder
from raytrain_vla.data.formats.writer_stats import histogram, image_stats, nested, vector_stats

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CHUNKS_SIZE = 1000  # files per chunk directory, LeRobot's
ROW_GROUP_BYTES = 64 * 2**20  # rows held before they go out as one row group
# info.json names the codec as the stream reports it, not the encoder that wrote it
_CODEC_NAMES = {"libx264": "h264", "libx265": "hevc", "libsvtav1": "av1", "libaom-av1": "av1"}
_PA_TYPES = {"float32": pa.float32(), "float64": pa.float64(), "bool": pa.bool_(),
             "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64()}  # fmt: skip


@dataclass(frozen=True)
class VideoSpec:
    """How every camera is encoded. The defaults are LeRobot's: AV1, a keyframe every 2 frames."""

    codec: str = "libsvtav1"
    crf: int | None = 30
    gop: int = 2
    preset: str | int | None = 12


@dataclass
class EpisodeData:
    """One episode: per-camera (T, H, W, 3) uint8 frames, (T, S) states, (T, A) actions, and
    `extra` per-frame columns ((T,) or (T, D) arrays of a numeric or bool dtype)."""

    cameras: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    task: str
    extra: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class DatasetSpec:
    """Dataset-wide metadata that is not in the episodes themselves.

    `images`: "video" (one mp4 per camera and file) or "png" (LeRobot's `dtype: image`, PNG
    cells in the data files). `channels_first`: image features' shape as [3, H, W] (LeRobot's
    hub conversions, e.g. `lerobot/metaworld_mt50`). `names`: a feature's `names` in info.json,
    over `state_names` / `action_names` and the default."""

    fps: int
    video: VideoSpec = field(default_factory=VideoSpec)
    robot_type: str = "unknown"
    state_names: list[str] | None = None
    action_names: list[str] | None = None
    images: str = "video"
    channels_first: bool = False
    names: dict[str, Any] = field(default_factory=dict)
    data_file_mb: float = 100  # LeRobot's data_files_size_in_mb
    video_file_mb: float = 200  # LeRobot's video_files_size_in_mb

    def __post_init__(self) -> None:
        if self.images not in ("video", "png"):
            raise ValueError(f"DatasetSpec.images: {self.images!r}, expected 'video' or 'png'")


def write_lerobot_dataset(
    root: str | os.PathLike, episodes: Sequence[EpisodeData], spec: DatasetSpec
) -> Path:
    """Write `episodes` as a LeRobot v3.0 dataset at `root` (missing or an empty directory)."""
    refuse_non_empty(Path(root))
    if not episodes:
        raise ValueError("no episodes to write")
    with DatasetWriter(root, spec) as writer:
        for episode in episodes:
            writer.add(episode)
    return Path(root)


def _next_file(loc: tuple[int, int]) -> tuple[int, int]:
    chunk, file = loc
    return (chunk, file + 1) if file + 1 < CHUNKS_SIZE else (chunk + 1, 0)


def _png(frame: np.ndarray) -> bytes:
    """PNG bytes of one (H, W, 3) uint8 frame, through PIL as LeRobot's image columns are."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


class DatasetWriter:
    """A LeRobot v3.0 dataset written one episode at a time (`add`), complete at `close` (or at
    the end of a `with` block; an exception there leaves nothing behind). The first episode
    fixes the features; every later one must have the same cameras, shapes and columns."""

    def __init__(self, root: str | os.PathLike, spec: DatasetSpec):
        self.root, self.spec = Path(root), spec
        refuse_non_empty(self.root)
        self._stack = ExitStack()
        self.tmp = self._stack.enter_context(atomic_directory(self.root))
        self.features: dict = {}
        self._first: EpisodeData | None = None
        self._frames = 0
        self._tasks: dict[str, int] = {}
        self._rows: list[dict] = []  # meta/episodes, one row per episode
        self._values: dict[str, list[np.ndarray]] = {}  # every frame's vectors: global stats
        self._hists: dict[str, np.ndarray] = {}  # each camera's pixel histogram, all frames
        self._data: pq.ParquetWriter | None = None
        self._data_loc = (0, 0)
        self._pending: list[pa.Table] = []  # rows not yet written: one row group per flush
        self._pending_bytes = 0
        self._videos: dict[str, VideoEncoder] = {}
        self._video_locs: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self._abort(kind, value, traceback)

    # -- one episode ------------------------------------------------------------------------
    def add(self, episode: EpisodeData) -> None:
        index = len(self._rows)
        if self._first is None:
            self._check_shape(episode, index)
            self._first = episode
            self.features = _features(episode, self.spec)
        else:
            self._check_like_first(episode, index)
        t, start = len(episode.state), self._frames
        row: dict[str, Any] = {
            "episode_index": index, "tasks": [episode.task], "length": t,
        }  # fmt: skip
        columns = self._columns(episode, index, start)
        stats: dict[str, dict] = {}
        for key, frames in episode.cameras.items():
            hist = histogram(frames)
            self._hists[key] = self._hists.get(key, 0) + hist
            stats[key] = image_stats(hist, t)
            if self.spec.images == "video":
                row.update(self._add_video(key, frames))
        for key, values in columns.items():
            flat = values.reshape(t, -1)
            stats[key] = vector_stats(flat)
            self._values.setdefault(key, []).append(flat)
        row.update(self._add_data(episode, columns))
        row["dataset_from_index"], row["dataset_to_index"] = start, start + t
        row["stats"] = stats
        self._rows.append(row)
        self._frames += t

    def _columns(self, episode: EpisodeData, index: int, start: int) -> dict[str, np.ndarray]:
        """The episode's numeric columns, in the features' order (cameras excluded)."""
        t = len(episode.state)
        task = self._tasks.setdefault(episode.task, len(self._tasks))
        frame_index = np.arange(t)
        cols = {
            "observation.state": episode.state.astype(np.float32),
            "action": episode.action.astype(np.float32),
            **{k: np.asarray(v) for k, v in episode.extra.items()},
            "timestamp": (frame_index / self.spec.fps).astype(np.float32),
            "frame_index": frame_index,
            "episode_index": np.full(t, index),
            "index": start + frame_index,
            "task_index": np.full(t, task),
        }
        return cols

    def _add_video(self, key: str, frames: np.ndarray) -> dict[str, Any]:
        encoder = self._videos.get(key)
        loc = self._video_locs.get(key, (0, 0))
        if encoder is not None and encoder.bytes_written() >= self.spec.video_file_mb * 2**20:
            encoder.close()
            encoder, loc = None, _next_file(loc)
        if encoder is None:
            v = self.spec.video
            path = self.tmp / VIDEO_PATH.format(
                video_key=key, chunk_index=loc[0], file_index=loc[1]
            )
            encoder = VideoEncoder(path, self.spec.fps, v.codec, v.crf, v.gop, v.preset)
            self._videos[key], self._video_locs[key] = encoder, loc
        start = encoder.frames / self.spec.fps
        encoder.add(frames)
        return {
            f"videos/{key}/chunk_index": loc[0],
            f"videos/{key}/file_index": loc[1],
            f"videos/{key}/from_timestamp": start,
            f"videos/{key}/to_timestamp": encoder.frames / self.spec.fps,
        }

    def _add_data(self, episode: EpisodeData, columns: dict[str, np.ndarray]) -> dict[str, int]:
        arrays: dict[str, pa.Array] = {}
        if self.spec.images == "png":
            for key, frames in episode.cameras.items():
                cells = [{"bytes": _png(f), "path": None} for f in frames]
                arrays[key] = pa.array(
                    cells, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])
                )
        for key, values in columns.items():
            feat = self.features[key]
            kind = _PA_TYPES[feat["dtype"]]
            if feat["shape"] == [1] and values.ndim == 1:
                arrays[key] = pa.array(values, type=kind)
            else:
                vec = pa.list_(pa.field("element", kind), feat["shape"][0])
                arrays[key] = pa.FixedSizeListArray.from_arrays(
                    pa.array(values.reshape(-1), type=kind), type=vec
                )
        table = pa.table(arrays).replace_schema_metadata(
            {"huggingface": _hf_metadata(self.features)}
        )
        written = self._data_path().stat().st_size if self._data is not None else 0
        if written + self._pending_bytes >= self.spec.data_file_mb * 2**20:  # roll over
            self._flush_data()
            if self._data is not None:
                self._data.close()
            self._data, self._data_loc = None, _next_file(self._data_loc)
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        if self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush_data()
        return {"data/chunk_index": self._data_loc[0], "data/file_index": self._data_loc[1]}

    def _data_path(self) -> Path:
        chunk, file = self._data_loc
        return self.tmp / DATA_PATH.format(chunk_index=chunk, file_index=file)

    def _flush_data(self) -> None:
        """The pending episodes' rows as one row group of the current data file."""
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        if self._data is None:
            self._data_path().parent.mkdir(parents=True, exist_ok=True)
            self._data = pq.ParquetWriter(self._data_path(), table.schema, compression="snappy")
        self._data.write_table(table)
        self._pending, self._pending_bytes = [], 0

    def _check_shape(self, episode: EpisodeData, index: int) -> None:
        t = len(episode.state)
        if t < 1 or len(episode.action) != t:
            raise ValueError(f"episode {index}: {t} states and {len(episode.action)} actions")
        for key, values in episode.extra.items():
            if len(values) != t:
                raise ValueError(f"episode {index} column {key}: {len(values)} rows, expected {t}")
            if str(np.asarray(values).dtype) not in _PA_TYPES:
                raise ValueError(
                    f"episode {index} column {key}: dtype {np.asarray(values).dtype}, expected "
                    f"one of {', '.join(_PA_TYPES)}"
                )
        for key, frames in episode.cameras.items():
            if frames.ndim != 4 or frames.dtype != np.uint8 or frames.shape[-1] != 3:
                raise ValueError(
                    f"episode {index} camera {key}: frames {frames.shape} {frames.dtype}, "
                    "expected (T, H, W, 3) uint8 RGB"
                )

    def _check_like_first(self, episode: EpisodeData, index: int) -> None:
        first = self._first
        assert first is not None
        self._check_shape(episode, index)
        t = len(episode.state)
        if list(episode.cameras) != list(first.cameras):
            raise ValueError(
                f"episode {index}: cameras {list(episode.cameras)} != {list(first.cameras)}"
            )
        if list(episode.extra) != list(first.extra):
            raise ValueError(
                f"episode {index}: columns {list(episode.extra)} != {list(first.extra)}"
            )
        pairs = [(episode.state, first.state), (episode.action, first.action)]
        pairs += [(np.asarray(episode.extra[k]), np.asarray(v)) for k, v in first.extra.items()]
        if any(a.shape[1:] != b.shape[1:] or a.dtype != b.dtype for a, b in pairs):
            raise ValueError(f"episode {index}: state/action/column shapes differ from episode 0")
        for key, frames in episode.cameras.items():
            want = (t, *first.cameras[key].shape[1:])
            if frames.shape != want:
                raise ValueError(
                    f"episode {index} camera {key}: frames {frames.shape} {frames.dtype}, "
                    f"expected {want} uint8 RGB"
                )

    # -- the end ----------------------------------------------------------------------------
    def close(self) -> Path:
        """Finish the files and the metadata, and move the dataset into place."""
        try:
            if not self._rows:
                raise ValueError("no episodes to write")
            self._flush_data()
            self._close_files(keep=True)
            self._write_meta()
        except BaseException as err:
            self._abort(type(err), err, err.__traceback__)
            raise
        self._stack.close()  # atomic_directory renames the finished dataset into place
        return self.root

    def _abort(self, kind, value, traceback) -> None:
        self._close_files(keep=False)
        self._stack.__exit__(kind, value, traceback)

    def _close_files(self, keep: bool) -> None:
        """Close the open data file and videos; `keep=False` drops the videos' temporaries."""
        if self._data is not None:
            self._data.close()
            self._data = None
        for encoder in self._videos.values():
            encoder.close() if keep else encoder.abort()
        self._videos.clear()

    def _write_meta(self) -> None:
        out, rows, n = self.tmp, self._rows, self._frames
        cameras = list(self._first.cameras) if self._first is not None else []
        ep_cols: dict[str, pa.Array] = {
            "episode_index": pa.array(np.arange(len(rows))),
            "tasks": pa.array([r["tasks"] for r in rows], type=pa.list_(pa.string())),
            "length": pa.array(np.array([r["length"] for r in rows], np.int64)),
        }
        keys = ["data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
        if self.spec.images == "video":
            for cam in cameras:
                keys += [f"videos/{cam}/{k}" for k in ("chunk_index", "file_index")]
                keys += [f"videos/{cam}/{k}" for k in ("from_timestamp", "to_timestamp")]
        for key in keys:
            dtype = np.float64 if key.endswith("timestamp") else np.int64
            ep_cols[key] = pa.array(np.array([r[key] for r in rows], dtype))
        for feat in self.features:
            for stat in rows[0]["stats"][feat]:
                arr = np.stack([r["stats"][feat][stat] for r in rows])
                ep_cols[f"stats/{feat}/{stat}"] = nested(
                    arr, pa.int64() if stat == "count" else pa.float64()
                )
        zeros = pa.array(np.zeros(len(rows), np.int64))
        ep_cols["meta/episodes/chunk_index"] = zeros
        ep_cols["meta/episodes/file_index"] = zeros
        (out / "meta/episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.table(ep_cols), out / "meta/episodes/chunk-000/file-000.parquet")

        # meta/tasks.parquet: written through pandas, so `task` is the index as LeRobot stores it
        import pandas as pd

        names = list(self._tasks)
        tasks_df = pd.DataFrame(
            {"task_index": np.arange(len(names))}, index=pd.Index(names, name="task", dtype=object)
        )
        tasks_df.to_parquet(out / "meta/tasks.parquet")

        stats = {
            k: image_stats(self._hists[k], n)
            if k in self._hists
            else vector_stats(np.concatenate(self._values[k]))
            for k in self.features
        }
        _write_json(
            out / "meta/stats.json",
            {k: {s: v.tolist() for s, v in d.items()} for k, d in stats.items()},
        )
        info = {
            "codebase_version": "v3.0", "fps": self.spec.fps, "features": self.features,
            "total_episodes": len(rows), "total_frames": n, "total_tasks": len(names),
            "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": self.spec.data_file_mb,
            "video_files_size_in_mb": self.spec.video_file_mb, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.spec.images == "video" else None,
            "robot_type": self.spec.robot_type, "splits": {"train": f"0:{len(rows)}"},
        }  # fmt: skip
        _write_json(out / "meta/info.json", info)


def _features(episode: EpisodeData, spec: DatasetSpec) -> dict:
    v = spec.video
    feats: dict = {}
    for key, frames in episode.cameras.items():
        h, w = frames.shape[1:3]
        if spec.images == "png":
            shape, names = [h, w, 3], ["height", "width", "channels"]
            if spec.channels_first:
                shape, names = [3, h, w], ["channels", "height", "width"]
            feats[key] = {"dtype": "image", "shape": shape, "names": names}
            continue
        info = {
            "video.height": h, "video.width": w, "video.codec": _CODEC_NAMES.get(v.codec, v.codec),
            "video.pix_fmt": PIX_FMT, "video.fps": spec.fps, "video.channels": 3,
            "has_audio": False, "video.g": v.gop, "video.crf": v.crf, "video.preset": v.preset,
            "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {},
            "is_depth_map": False,
        }  # fmt: skip
        feats[key] = {"dtype": "video", "shape": [h, w, 3],
                      "names": ["height", "width", "channels"], "info": info}  # fmt: skip
    for key, arr, names in (
        ("observation.state", episode.state, spec.state_names),
        ("action", episode.action, spec.action_names),
    ):
        dim = int(np.prod(arr.shape[1:]))
        names = names or [f"{key.split('.')[-1]}_{i}" for i in range(dim)]
        feats[key] = {"dtype": "float32", "shape": [dim], "names": spec.names.get(key, names)}
    for key, values in episode.extra.items():
        values = np.asarray(values)
        shape = [1] if values.ndim == 1 else [int(np.prod(values.shape[1:]))]
        feats[key] = {"dtype": str(values.dtype), "shape": shape, "names": spec.names.get(key)}
    feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for k in SCALARS[1:]:
        feats[k] = {"dtype": "int64", "shape": [1], "names": None}
    return feats


def _hf_metadata(features: dict) -> bytes:
    """The `huggingface` schema metadata LeRobot's parquet files carry (datasets.Features)."""
    hf = {}
    for k, f in features.items():
        if f["dtype"] == "video":
            continue
        if f["dtype"] == "image":
            hf[k] = {"_type": "Image"}
            continue
        value = {"dtype": f["dtype"], "_type": "Value"}
        hf[k] = (
            value
            if f["shape"] == [1]
            else {"feature": value, "length": f["shape"][0], "_type": "List"}
        )
    return json.dumps({"info": {"features": hf}}).encode()


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=4)
