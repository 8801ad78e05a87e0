"""Arrow/Parquet shards: LeRobot samples precomputed once, so training reads rows, not videos.

Layout of a shards directory OUT (see docs/shards.md):

    OUT/meta/...                     copy of the source dataset's meta/ (LeRobotMeta.load(OUT) works)
    OUT/shards.json                  manifest: version, chunk_size, image format, cameras, dims,
                                     sample count, source fingerprint, shard list with id ranges
    OUT/shards/shard-00000.parquet   one row per sample, sorted by sample_id (= LeRobot `index`):
        sample_id, episode_index, frame_index, timestamp, task_index, state [S], actions
        [chunk][A], action_is_pad [chunk], image/<key>

Every frame of every episode is a sample (train and val alike), so the plan, split and
normaliser code see the same ids as on the LeRobot source. Images are raw CHW uint8
(`fixed_size_binary`) or lossless PNG (PyAV's `png` codec), so `ShardSource.read` returns
exactly what `LeRobotSource.read` returns, pixel for pixel. Decoding video once at convert time
instead of every epoch is the point: a shard read is a parquet row-group read plus `take`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.common.atomic import atomic_directory, refuse_non_empty
from raytrain_vla.common.image_ops import resize_images
from raytrain_vla.common.location import DataPath, as_path, file_key, is_remote, parquet_file
from raytrain_vla.data.formats.lerobot import (
    DatasetError,
    LeRobotMeta,
    column_to_numpy,
    dataset_fingerprint,
    read_frames_table,
)
from raytrain_vla.data.formats.lerobot_common import inside_root
from raytrain_vla.data.formats.lerobot_source import LeRobotSource

MANIFEST = "shards.json"
# 2 dropped version 1's `task_tokens` column (the model's processor tokenizes at read time);
# readers take both, as they never read that column.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
IMAGE_FORMATS = ("raw", "png")
ROW_GROUP_SIZE = 256  # rows decoded together on read: small, so a read touches little extra
_MANIFEST_KEYS = ("chunk_size", "image_format", "cameras", "state_dim", "action_dim")
_MANIFEST_KEYS += ("num_samples", "source_fingerprint", "shards")
_PIX_FMT = {1: "gray", 3: "rgb24", 4: "rgba"}
_CACHE_SIZE = 16
_OPEN: OrderedDict[tuple, tuple[pq.ParquetFile, np.ndarray]] = OrderedDict()  # per process


# -- writing -------------------------------------------------------------------------------
def _fixed_list(flat: np.ndarray, *sizes: int) -> pa.Array:
    """Nested fixed-size lists over a flat buffer, innermost size last."""
    arr: pa.Array = pa.array(np.ascontiguousarray(flat).reshape(-1))
    for size in reversed(sizes):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def encode_png(images_chw: np.ndarray) -> list[bytes]:
    """Lossless PNG bytes per (C, H, W) uint8 image, via PyAV (no Pillow dependency)."""
    n, c, h, w = images_chw.shape
    if c not in _PIX_FMT:
        raise DatasetError(f"PNG shards support 1, 3 or 4 channels, got {c}")
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = w, h, _PIX_FMT[c]
    out = []
    for img in images_chw:
        hwc = img[0] if c == 1 else img.transpose(1, 2, 0)
        packets = ctx.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(hwc), _PIX_FMT[c]))
        out.append(b"".join(bytes(p) for p in packets))
    return out


def decode_png(data: list[bytes], shape: tuple[int, int, int], where: str) -> np.ndarray:
    """(N, C, H, W) uint8 from PNG bytes; one decoder per image (a reused one corrupts frames)."""
    c, h, w = shape
    out = np.empty((len(data), c, h, w), dtype=np.uint8)
    for i, blob in enumerate(data):
        frames = av.CodecContext.create("png", "r").decode(av.Packet(blob))
        img = frames[0].to_ndarray(format=_PIX_FMT[c]) if frames else np.empty(0)
        if img.size != c * h * w or img.shape[:2] != (h, w):
            raise DatasetError(f"{where}: PNG image {i} does not decode to CHW {list(shape)}")
        out[i] = img.reshape(h, w, c).transpose(2, 0, 1)
    return out


_SCALARS = {"sample_id": np.int64, "episode_index": np.int64, "frame_index": np.int64}
_SCALARS |= {"timestamp": np.float32, "task_index": np.int64}
_LISTS = {"state": np.float32, "actions": np.float32, "action_is_pad": bool}


def sample_table(cols: dict[str, np.ndarray], cameras: list[str], image_format: str) -> pa.Table:
    """One parquet table from shard columns (LeRobotSource.read + episode/frame/time)."""
    arrays = {k: pa.array(cols[k].astype(t)) for k, t in _SCALARS.items()}
    arrays |= {k: _fixed_list(cols[k].astype(t), *cols[k].shape[1:]) for k, t in _LISTS.items()}
    for key in cameras:
        img = np.ascontiguousarray(cols[f"image/{key}"], dtype=np.uint8)
        if image_format == "png":
            arrays[f"image/{key}"] = pa.array(encode_png(img), pa.binary())
        else:  # fixed_size_binary over the CHW bytes: no copy, no per-row objects
            width = int(np.prod(img.shape[1:]))
            buffers = [None, pa.py_buffer(img.reshape(-1))]
            arrays[f"image/{key}"] = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(width), len(img), buffers
            )
    return pa.table(arrays)


def write_shard(
    path: Path,
    batches: Iterable[dict[str, np.ndarray]],
    camera_keys: list[str],
    image_format: str,
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict:
    """Write consecutive sample batches as one parquet file; returns its manifest entry."""
    writer, ids = None, []
    try:
        for cols in batches:
            table = sample_table(cols, camera_keys, image_format)
            if writer is None:  # zstd everywhere: it passes incompressible PNG bytes through
                stats = ["sample_id", "episode_index", "frame_index", "task_index"]
                writer = pq.ParquetWriter(path, table.schema, compression="zstd",
                                          use_dictionary=False, write_statistics=stats)  # fmt: skip
            writer.write_table(table, row_group_size=row_group_size)
            ids.append(cols["sample_id"])
    finally:
        if writer is not None:
            writer.close()
    ids_all = np.concatenate(ids) if ids else np.empty(0, np.int64)
    if not len(ids_all) or not np.array_equal(ids_all, np.arange(ids_all[0], ids_all[-1] + 1)):
        raise DatasetError(f"{path}: a shard must hold a non-empty contiguous run of sample ids")
    return {
        "file": f"shards/{path.name}",
        "first_sample_id": int(ids_all[0]),
        "last_sample_id": int(ids_all[-1]),
        "num_rows": len(ids_all),
        "bytes": path.stat().st_size,  # checked when the shards are opened for training
    }


def shard_batches(
    meta: LeRobotMeta, chunk_size: int, rows: int
) -> tuple[list[str], Callable[[int, int], Iterator[dict[str, np.ndarray]]]]:
    """Camera keys and `batches(start, stop)`: shard columns, `rows` samples at a time."""
    source = LeRobotSource(meta, chunk_size)
    frames = read_frames_table(meta, ["frame_index", "timestamp"])
    frame_index, timestamp = (column_to_numpy(frames, k) for k in ("frame_index", "timestamp"))

    def batches(start: int, stop: int) -> Iterator[dict[str, np.ndarray]]:
        for lo in range(start, stop, rows):
            ids = np.arange(lo, min(lo + rows, stop), dtype=np.int64)
            cols = source.read(ids)
            cols |= {"episode_index": source.episode_of[ids], "frame_index": frame_index[ids]}
            cols |= {"timestamp": timestamp[ids]}
            yield cols

    return source.camera_keys, batches


def build_manifest(
    meta: LeRobotMeta,
    camera_keys: list[str],
    chunk_size: int,
    image_format: str,
    shards: list[dict],
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict:
    """The shards.json content; checks that the shards cover every sample exactly once."""
    _check_cover(shards, meta.total_frames, "shards")
    m = {"format": "raytrain_vla.shards", "version": FORMAT_VERSION, "chunk_size": chunk_size}
    m |= {"image_format": image_format}
    m["cameras"] = {k: list(meta.camera_shape(k)) for k in camera_keys}
    m |= {"state_dim": meta.state_dim, "action_dim": meta.action_dim}
    m |= {"num_samples": meta.total_frames, "num_episodes": meta.num_episodes}
    m |= {"source_fingerprint": dataset_fingerprint(meta), "source_root": str(meta.root)}
    return m | {"row_group_size": row_group_size, "shards": shards}


def _write_with_ray(
    write_range: Callable[[int, int, int], dict], ranges: list[tuple[int, int, int]]
) -> list[dict]:
    """One Ray Data task per shard; file names depend on the range index only."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False)

    def write(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        entries = []
        for i, a, b in zip(batch["index"], batch["start"], batch["stop"], strict=True):
            try:
                entries.append(write_range(int(i), int(a), int(b)))
            except ValueError as e:  # bad data: report it plainly, not as a Ray traceback
                entries.append({"error": f"{e}"})
        return {"entry": np.array([json.dumps(e) for e in entries], dtype=object)}

    items = [{"index": i, "start": a, "stop": b} for i, a, b in ranges]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    entries = [json.loads(r["entry"]) for r in ds.map_batches(write, batch_size=1).take_all()]
    for e in entries:
        if "error" in e:
            raise DatasetError(e["error"])
    return entries


def convert_to_shards(
    root: str | os.PathLike,
    out: str | os.PathLike,
    chunk_size: int = 8,
    image_format: str = "raw",
    samples_per_shard: int = 4096,
    use_ray: bool = True,
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict:
    """Convert a LeRobot dataset to shards at `out`; either may be a path or a URI.

    On disk the shards are built in a hidden sibling, then renamed. In object storage each
    shard task uploads its own file, and `shards.json` is uploaded last, so readers never see
    a half-written directory; a failed conversion removes what it uploaded.
    `use_ray=False` writes the shards in this process (unit tests); otherwise each shard is a
    Ray Data task, joining the running Ray or starting a local one. Returns the manifest.
    """
    root, out = as_path(root), as_path(out)
    if image_format not in IMAGE_FORMATS:
        raise DatasetError(f"image format {image_format!r} is not one of {IMAGE_FORMATS}")
    if min(chunk_size, samples_per_shard, row_group_size) < 1:
        raise DatasetError("chunk_size, samples_per_shard and row groups must be >= 1")
    if (root / MANIFEST).exists():
        raise DatasetError(f"{root}: already a shards directory; convert from the LeRobot dataset")
    refuse_non_empty(out)  # a prefix with objects under it, in object storage
    meta = LeRobotMeta.load(root)
    cameras, batches = shard_batches(meta, chunk_size, row_group_size)
    n = meta.total_frames
    ranges = [
        (i, a, min(a + samples_per_shard, n)) for i, a in enumerate(range(0, n, samples_per_shard))
    ]

    def write_all(shards_dir: DataPath, meta_dir: Path) -> dict:
        remote, base = is_remote(shards_dir), str(shards_dir)  # a string: tasks pickle it

        def write_range(index: int, start: int, stop: int) -> dict:  # deterministic name per range
            name = f"shard-{index:05d}.parquet"
            if not remote:
                path = Path(base) / name
                return write_shard(
                    path, batches(start, stop), cameras, image_format, row_group_size
                )
            with tempfile.TemporaryDirectory(prefix="raytrain_vla-shard-") as local:
                path = Path(local) / name
                entry = write_shard(path, batches(start, stop), cameras, image_format,
                                    row_group_size)  # fmt: skip
                target = as_path(f"{base}/{name}")
                target.fs.put_file(str(path), target.path)
                return entry

        _copy_tree(root / "meta", meta_dir)
        if use_ray:
            entries = _write_with_ray(write_range, ranges)
        else:
            entries = [write_range(*r) for r in ranges]
        entries.sort(key=lambda e: e["first_sample_id"])
        return build_manifest(meta, cameras, chunk_size, image_format, entries, row_group_size)

    if not is_remote(out):
        with atomic_directory(out) as tmp:
            (tmp / "shards").mkdir()
            manifest = write_all(tmp / "shards", tmp / "meta")
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest
    from raytrain_vla.common.run_storage import remove_tree, upload_directory

    try:
        with tempfile.TemporaryDirectory(prefix="raytrain_vla-shards-") as staging:
            manifest = write_all(out / "shards", Path(staging) / "meta")
            (Path(staging) / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            upload_directory(Path(staging), out, last=(MANIFEST,), replace=False)
    except BaseException:
        remove_tree(out)  # it was empty: what is there now is this conversion's
        raise
    return manifest


def _copy_tree(source: DataPath, target: Path) -> None:
    """Copy a directory (local, or under a URI) to a new local directory."""
    if not is_remote(source):
        shutil.copytree(source, target)
        return
    from raytrain_vla.common.run_storage import download_directory

    download_directory(source, target)


def _check_cover(shards: list[dict], n: int, where: str) -> None:
    """Shard id ranges must tile 0..n-1 in order, or ids would map to the wrong rows."""
    expect = 0
    for e in shards:
        if e["first_sample_id"] != expect or e["last_sample_id"] - expect + 1 != e["num_rows"]:
            raise DatasetError(f"{where}: {e['file']} does not continue the ids at {expect}")
        expect = e["last_sample_id"] + 1
    if expect != n:
        raise DatasetError(f"{where}: shards cover {expect} samples, the dataset has {n}")


# -- reading -------------------------------------------------------------------------------
def load_manifest(root: DataPath) -> dict:
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; not a shards directory") from None
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("version") not in READABLE_VERSIONS:
        got = manifest.get("version") if isinstance(manifest, dict) else None
        raise DatasetError(
            f"{path}: shards format version {got!r}, expected one of {READABLE_VERSIONS}"
        )
    missing = [k for k in _MANIFEST_KEYS if k not in manifest]
    if missing:
        raise DatasetError(f"{path}: missing key(s) {missing}")
    return manifest


def shard_path(root: DataPath, entry: dict) -> DataPath:
    """A manifest entry's shard file: inside the root, present, and as large as when written
    (the source fingerprint a shard run records does not cover the shards themselves)."""
    where = f"{root / MANIFEST}: shard 'file'"
    path = inside_root(root, str(entry["file"]), where)
    if not path.is_file():
        raise DatasetError(f"{path}: shard file missing (listed in {root / MANIFEST})")
    size, recorded = path.stat().st_size, entry.get("bytes")
    if recorded is not None and size != recorded:
        raise DatasetError(
            f"{path}: {size} bytes, but {root / MANIFEST} recorded {recorded} when it was written; "
            "the shard changed since (convert again)"
        )
    return path


def _open_shard(path: str) -> tuple[pq.ParquetFile, np.ndarray]:
    """A cached open parquet file plus its row-group start rows (LRU, per process)."""
    key = file_key(path)
    if key in _OPEN:
        _OPEN.move_to_end(key)
        return _OPEN[key]
    try:
        pf = parquet_file(path, memory_map=True)  # byte ranges of its row groups, if remote
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: unreadable shard ({e})") from e
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    _OPEN[key] = (pf, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    while len(_OPEN) > _CACHE_SIZE:
        _OPEN.popitem(last=False)[1][0].close()
    return _OPEN[key]


class ShardSource:
    """The index of a shards directory; hands each read task a `ShardRead` that names only the
    shards its samples lie in."""

    def __init__(self, root: str | os.PathLike, chunk_size: int):
        self.root = as_path(root)
        m = load_manifest(self.root)
        if int(m["chunk_size"]) != chunk_size:
            raise DatasetError(
                f"{self.root / MANIFEST}: shards were written with chunk_size {m['chunk_size']} "
                f"but chunk_size {chunk_size} was requested; convert again or use {m['chunk_size']}"
            )
        self.chunk_size = chunk_size
        self.image_format = str(m["image_format"])
        self.cameras = {k: tuple(int(s) for s in v) for k, v in m["cameras"].items()}
        self.camera_keys = list(self.cameras)
        self.fingerprint = str(m["source_fingerprint"])
        self.num_samples = int(m["num_samples"])
        self.state_dim, self.action_dim = int(m["state_dim"]), int(m["action_dim"])
        self.first_ids = np.array([e["first_sample_id"] for e in m["shards"]], dtype=np.int64)
        _check_cover(m["shards"], self.num_samples, str(self.root / MANIFEST))
        self.files = [str(shard_path(self.root, e)) for e in m["shards"]]  # absolute: picklable
        self.meta = LeRobotMeta.load(self.root)
        if self.meta.total_frames != self.num_samples:
            raise DatasetError(
                f"{self.root}: shards.json has {self.num_samples} samples, "
                f"meta/info.json {self.meta.total_frames} frames"
            )
        self.episode_ends = self.meta.episode_to_index.astype(np.int64)

    @cached_property
    def episode_of(self) -> np.ndarray:
        """Episode of every sample (O(samples): tools and tests, never a read task)."""
        return np.repeat(np.arange(len(self.episode_ends)), np.diff(self.episode_ends, prepend=0))

    def reader(
        self, sample_ids: np.ndarray, frame_size: tuple[int, int] | None = None
    ) -> ShardRead:
        """The shards these samples lie in; `frame_size` (H, W) resizes every camera in the task
        (as `LeRobotSource.reader` does while decoding)."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        bad = ids[(ids < 0) | (ids >= self.num_samples)]
        if len(bad):
            raise DatasetError(
                f"{self.root}: ids {bad[:5].tolist()} not in 0..{self.num_samples - 1}"
            )
        shard = np.searchsorted(self.first_ids, ids, side="right") - 1
        used, local = np.unique(shard, return_inverse=True)
        tasks = self.meta.tasks_of_episodes(np.searchsorted(self.episode_ends, ids, side="right"))
        return ShardRead(
            ids=ids,
            files=[self.files[i] for i in used],
            first_ids=self.first_ids[used],
            shard=local.astype(np.int32),
            chunk_size=self.chunk_size,
            image_format=self.image_format,
            cameras=self.cameras,
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            tasks=tasks,
            frame_size=None if frame_size is None else (int(frame_size[0]), int(frame_size[1])),
        )

    def read(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The same columns, dtypes and values as `LeRobotSource.read(sample_ids)`."""
        return self.reader(sample_ids).read()


@dataclass
class ShardRead:
    """Samples of one read task and the shards that hold them."""

    ids: np.ndarray
    files: list[str]
    first_ids: np.ndarray
    shard: np.ndarray  # per sample: index into files
    chunk_size: int
    image_format: str
    cameras: dict[str, tuple[int, int, int]]
    state_dim: int
    action_dim: int
    tasks: dict[int, str]  # task strings of these samples' episodes, by task_index
    frame_size: tuple[int, int] | None = None  # (H, W) every camera is resized to, if set

    def _read_rows(self, shard: int, rows: np.ndarray) -> pa.Table:
        """Rows of one shard in the given order, reading only the row groups that hold them."""
        pf, starts = _open_shard(self.files[shard])
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of)
        names = ["sample_id", "state", "actions", "action_is_pad", "task_index"]
        table = pf.read_row_groups(groups.tolist(), names + [f"image/{k}" for k in self.cameras])
        sizes = starts[groups + 1] - starts[groups]
        first_in_table = np.cumsum(sizes) - sizes  # where each read group starts in `table`
        local = first_in_table[np.searchsorted(groups, group_of)] + rows - starts[group_of]
        return table.take(pa.array(local))

    def _columns(self, table: pa.Table, where: str) -> dict[str, np.ndarray]:
        n, chunk = table.num_rows, self.chunk_size
        shapes = {"sample_id": (), "state": (self.state_dim,), "actions": (chunk, self.action_dim)}
        shapes |= {"action_is_pad": (chunk,), "task_index": ()}  # LeRobotSource's column order
        out = {}
        for key, shape in shapes.items():
            values = table[key].combine_chunks()
            for _ in shape:  # flatten() respects slicing offsets, unlike .values
                values = values.flatten()
            dtype = _SCALARS.get(key) or _LISTS[key]
            out[key] = values.to_numpy(zero_copy_only=False).reshape(n, *shape).astype(dtype)
        for key, shape in self.cameras.items():
            col = table[f"image/{key}"].combine_chunks()
            if self.image_format == "png":
                out[f"image/{key}"] = decode_png(col.to_pylist(), shape, f"{where} {key}")
            elif n:
                width = int(np.prod(shape))
                flat = np.frombuffer(col.buffers()[1], np.uint8, n * width, col.offset * width)
                out[f"image/{key}"] = flat.reshape(n, *shape).copy()
            else:
                out[f"image/{key}"] = np.empty((0, *shape), np.uint8)
        if self.frame_size is not None:
            images = {k: v for k, v in out.items() if k.startswith("image/")}
            out |= resize_images(images, self.frame_size)
        return out

    def read(self) -> dict[str, np.ndarray]:
        ids = self.ids
        out: dict[str, np.ndarray] = {}
        if not len(ids):  # typed empty columns
            chunk, dims = self.chunk_size, {"state": (self.state_dim,)}
            dims |= {"actions": (chunk, self.action_dim), "action_is_pad": (chunk,)}
            out = {k: np.empty((0, *dims.get(k, ())), t) for k, t in {**_SCALARS, **_LISTS}.items()
                   if k in ("sample_id", "task_index", *dims)}  # fmt: skip
            out |= {
                f"image/{k}": np.empty((0, v[0], *(self.frame_size or v[1:])), np.uint8)
                for k, v in self.cameras.items()
            }
        for s in range(len(self.files)):
            sel = np.flatnonzero(self.shard == s)
            rows = self._read_rows(s, ids[sel] - self.first_ids[s])
            part = self._columns(rows, self.files[s])
            if not np.array_equal(part["sample_id"], ids[sel]):  # cheap guard against bad files
                raise DatasetError(f"{self.files[s]}: rows disagree with the ids in {MANIFEST}")
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((len(ids), *value.shape[1:]), dtype=value.dtype)
                out[key][sel] = value
        task = np.empty(len(ids), dtype=object)
        for i, t in enumerate(out.get("task_index", np.zeros(0, np.int64)).tolist()):
            if t not in self.tasks:
                raise DatasetError(
                    f"{self.files[self.shard[i]]}: sample {ids[i]} has task_index {t}, not a task "
                    "of its episode in meta/episodes"
                )
            task[i] = self.tasks[t]
        cameras = {k: v for k, v in out.items() if k.startswith("image/")}
        low = {k: v for k, v in out.items() if not k.startswith("image/")}
        return {**low, "task": task, **cameras}
