"""How the driver picks its Ray cluster, without starting one: `ray.init` is recorded."""

from __future__ import annotations

import pytest
import ray
import ray._private.services as services

from raytrain_vla.config import load_config
from raytrain_vla.train import launch


@pytest.fixture
def calls(monkeypatch):
    made: list[dict] = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: made.append(kw))
    return made


def _node_file(monkeypatch, recorded, live) -> None:
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: recorded)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset(live))


def test_no_cluster_on_the_node_starts_a_private_one(calls, monkeypatch, capsys):
    _node_file(monkeypatch, None, [])
    launch.init_ray(load_config())
    assert calls == [
        {"address": None, "num_cpus": 6, "include_dashboard": None, "log_to_driver": True}
    ]
    assert capsys.readouterr().err == ""


def test_a_live_ray_start_cluster_is_joined_with_a_note(calls, monkeypatch, capsys):
    _node_file(monkeypatch, "10.0.0.1:6379", ["10.0.0.1:6379"])
    launch.init_ray(load_config())
    assert calls == [{"address": "auto"}]
    assert "joining the Ray cluster `ray start` runs on this node (10.0.0.1:6379)" in (
        capsys.readouterr().err
    )


def test_local_num_cpus_or_a_dead_cluster_gets_a_private_cluster(calls, monkeypatch, capsys):
    _node_file(monkeypatch, "10.0.0.1:6379", ["10.0.0.1:6379"])
    launch.init_ray(load_config(None, ["--ray.local_num_cpus=3"]))
    _node_file(monkeypatch, "10.0.0.1:6379", [])  # killed: its node file stays behind
    launch.init_ray(load_config())
    assert [(c["address"], c["num_cpus"]) for c in calls] == [("local", 3), ("local", 6)]
    err = capsys.readouterr().err
    assert "private Ray cluster (ray.local_num_cpus is set)" in err
    assert "private Ray cluster (the one at 10.0.0.1:6379 is gone)" in err


def test_an_explicit_address_is_used_as_given(calls, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    launch.init_ray(load_config())
    assert calls == [{"address": "10.0.0.2:6379"}]


def test_local_num_cpus_with_an_address_is_refused_not_ignored(calls, monkeypatch):
    from raytrain_vla.config import ConfigError

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    with pytest.raises(ConfigError, match=r"'ray.local_num_cpus' \(3\).*joins 10.0.0.2:6379"):
        launch.init_ray(load_config(None, ["--ray.local_num_cpus=3"]))
    assert calls == []
