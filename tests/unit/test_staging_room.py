"""Background saves refused before the first step when the node's shared memory cannot hold them."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from torch import nn

from raytrain_vla.errors import NotRetriable
from raytrain_vla.train.checkpoint_saver import check_staging_room, staging_bytes


def test_staging_bytes_are_the_trained_weights_and_two_moments():
    model = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3))  # 220 + 63 parameters, fp32
    assert staging_bytes(model, frozen=["0.weight", "0.bias"]) == 3 * 63 * 4
    assert staging_bytes(model, frozen=[]) == 3 * 283 * 4


def test_a_node_without_room_is_refused_with_what_it_needs_and_has(tmp_path, monkeypatch):
    docker_default = 64 * 2**20  # a container's /dev/shm unless --shm-size says otherwise
    usage = SimpleNamespace(total=docker_default, used=0, free=docker_default)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    check_staging_room(32 * 2**20, local_ranks=2, shared=tmp_path)  # exactly the room: fine
    with pytest.raises(NotRetriable) as refused:
        check_staging_room(32 * 2**20 + 1, local_ranks=2, shared=tmp_path)
    message = str(refused.value)
    assert f"stages each rank's checkpoint shards in {tmp_path}" in message
    assert "2 rank(s) need 0.07 GB" in message and "0.07 GB free" in message
    assert "train.async_checkpoint=false" in message


def test_no_shared_memory_directory_means_no_check(tmp_path):
    check_staging_room(10**18, local_ranks=8, shared=tmp_path / "absent")
