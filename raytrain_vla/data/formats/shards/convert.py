"""The conversion job: a LeRobot dataset's samples precomputed into parquet shards, once.

Each shard is one Ray Data task (or, in tests, a loop in this process) that reads its range of
samples through `LeRobotSource`, so the shards hold exactly what the LeRobot source returns;
the manifest is written last, on disk by renaming a hidden sibling and in object storage by
uploading it after every shard, so that no reader sees a half-written directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raytrain_vla.common.atomic import atomic_directory, refuse_non_empty
from raytrain_vla.common.location import DataPath, as_path, is_remote
from raytrain_vla.data.formats.arrow_numpy import to_numpy
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta, read_frames_table
from raytrain_vla.data.formats.lerobot_source import LeRobotSource
from raytrain_vla.data.formats.shards.manifest import (
    IMAGE_FORMATS,
    LIST_COLUMNS,
    MANIFEST,
    ROW_GROUP_SIZE,
    SCALAR_COLUMNS,
    build_manifest,
)
from raytrain_vla.data.formats.shards.png import encode_png


def _fixed_list(flat: np.ndarray, *sizes: int) -> pa.Array:
    """Nested fixed-size lists over a flat buffer, innermost size last."""
    arr: pa.Array = pa.array(np.ascontiguousarray(flat).reshape(-1))
    for size in reversed(sizes):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def sample_table(cols: dict[str, np.ndarray], cameras: list[str], image_format: str) -> pa.Table:
    """One parquet table from shard columns (LeRobotSource.read + episode/frame/time)."""
    arrays = {k: pa.array(cols[k].astype(t)) for k, t in SCALAR_COLUMNS.items()}
    arrays |= {
        k: _fixed_list(cols[k].astype(t), *cols[k].shape[1:]) for k, t in LIST_COLUMNS.items()
    }
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
    frame_index, timestamp = (to_numpy(frames[k]) for k in ("frame_index", "timestamp"))

    def batches(start: int, stop: int) -> Iterator[dict[str, np.ndarray]]:
        for lo in range(start, stop, rows):
            ids = np.arange(lo, min(lo + rows, stop), dtype=np.int64)
            cols = source.read(ids)
            cols |= {"episode_index": source.episode_of[ids], "frame_index": frame_index[ids]}
            cols |= {"timestamp": timestamp[ids]}
            yield cols

    return source.camera_keys, batches


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
