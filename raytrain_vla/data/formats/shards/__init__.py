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

One job a module: `manifest` (the format: shards.json and the columns), `png` (image
encoding), `convert` (the conversion job), `reader` (`ShardSource`, `ShardRead`). The two entry
points are named here, as docs/shards.md and the CLI call them.
"""

from raytrain_vla.data.formats.shards.convert import convert_to_shards
from raytrain_vla.data.formats.shards.reader import ShardSource

__all__ = ["ShardSource", "convert_to_shards"]
