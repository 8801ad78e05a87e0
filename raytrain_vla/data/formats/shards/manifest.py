"""The shards format: what `shards.json` records and what a shard file's columns hold.

Shared by the conversion (which writes it) and the reader (which checks it), so that the two
never disagree on a version, a column or a dtype.
"""

from __future__ import annotations

import json

import numpy as np

from raytrain_vla.common.location import DataPath
from raytrain_vla.data.formats.lerobot import DatasetError, LeRobotMeta, dataset_fingerprint
from raytrain_vla.data.formats.lerobot_common import inside_root

MANIFEST = "shards.json"
# 2 dropped version 1's `task_tokens` column (the model's processor tokenizes at read time);
# readers take both, as they never read that column.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
IMAGE_FORMATS = ("raw", "png")
ROW_GROUP_SIZE = 256  # rows decoded together on read: small, so a read touches little extra
_MANIFEST_KEYS = ("chunk_size", "image_format", "cameras", "state_dim", "action_dim")
_MANIFEST_KEYS += ("num_samples", "source_fingerprint", "shards")

# A shard's columns and their dtypes, besides one `image/<key>` column per camera.
SCALAR_COLUMNS = {"sample_id": np.int64, "episode_index": np.int64, "frame_index": np.int64}
SCALAR_COLUMNS |= {"timestamp": np.float32, "task_index": np.int64}
LIST_COLUMNS = {"state": np.float32, "actions": np.float32, "action_is_pad": bool}


def build_manifest(
    meta: LeRobotMeta,
    camera_keys: list[str],
    chunk_size: int,
    image_format: str,
    shards: list[dict],
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict:
    """The shards.json content; checks that the shards cover every sample exactly once."""
    check_cover(shards, meta.total_frames, "shards")
    m = {"format": "raytrain_vla.shards", "version": FORMAT_VERSION, "chunk_size": chunk_size}
    m |= {"image_format": image_format}
    m["cameras"] = {k: list(meta.camera_shape(k)) for k in camera_keys}
    m |= {"state_dim": meta.state_dim, "action_dim": meta.action_dim}
    m |= {"num_samples": meta.total_frames, "num_episodes": meta.num_episodes}
    m |= {"source_fingerprint": dataset_fingerprint(meta), "source_root": str(meta.root)}
    return m | {"row_group_size": row_group_size, "shards": shards}


def check_cover(shards: list[dict], n: int, where: str) -> None:
    """Shard id ranges must tile 0..n-1 in order, or ids would map to the wrong rows."""
    expect = 0
    for e in shards:
        if e["first_sample_id"] != expect or e["last_sample_id"] - expect + 1 != e["num_rows"]:
            raise DatasetError(f"{where}: {e['file']} does not continue the ids at {expect}")
        expect = e["last_sample_id"] + 1
    if expect != n:
        raise DatasetError(f"{where}: shards cover {expect} samples, the dataset has {n}")


def load_manifest(root: DataPath) -> dict:
    """shards.json of `root`, refused when missing, unreadable, of another version or short
    of a key."""
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
