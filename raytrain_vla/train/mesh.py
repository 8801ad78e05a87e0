"""The data-parallel device mesh: flat (shard across every rank) or HSDP's 2-D
(replicate x shard), torchtitan's `dp_replicate x dp_shard`."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def mesh_shape(world_size: int, dp_shard: int) -> tuple[int, int]:
    """(replicate, shard) degrees; `dp_shard` 0 means one shard group of every rank."""
    shard = dp_shard or world_size
    if world_size % shard:
        raise ValueError(f"train.dp_shard={dp_shard} does not divide the world size {world_size}")
    return world_size // shard, shard


def build_mesh(device_type: str, world_size: int, dp_shard: int) -> DeviceMesh:
    """1-D when there is one shard group; otherwise 2-D, which `fully_shard` runs as HSDP
    (reduce-scatter within a group, all-reduce across groups)."""
    replicate, shard = mesh_shape(world_size, dp_shard)
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=("replicate", "shard"))
