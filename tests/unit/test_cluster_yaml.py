"""`cluster.yaml`: valid for Ray's autoscaler, consistent node types, and matching the README's job.

Offline and fast. Ray's own `prepare_config` + `validate_config` (what `ray up` runs before it
talks to the cloud) check the schema. No cluster is started and no AWS credentials are needed.
"""

from __future__ import annotations

import copy
import math
import re
import shlex
from pathlib import Path

import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from raytrain_vla.config import parse_cli

ROOT = Path(__file__).resolve().parents[2]
SHARED = "/shared"  # where cluster.yaml mounts the shared file system


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    """The config as `ray up` sees it after filling in the AWS defaults."""
    return prepare_config(copy.deepcopy(raw))


def _node_types(cfg: dict) -> dict:
    return cfg["available_node_types"]


def _trainer_type(cfg: dict) -> tuple[str, dict]:
    found = [(n, t) for n, t in _node_types(cfg).items() if "trainer" in t["resources"]]
    assert len(found) == 1, f"exactly one node type must offer `trainer`, got {found}"
    return found[0]


def _readme_job() -> list[str]:
    """The raytrain_vla.run arguments of the `ray job submit` command in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## On a real cluster", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("ray job submit"))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    argv = shlex.split(" ".join(command))
    return argv[argv.index("raytrain_vla.run") + 1 :]


def test_ray_autoscaler_accepts_the_config(raw, prepared):
    assert raw["provider"]["type"] == "aws"
    validate_config(prepared)  # raises jsonschema.ValidationError / ValueError when invalid
    for key in ("cluster_name", "max_workers", "idle_timeout_minutes", "auth"):
        assert key in raw, key
    assert raw["provider"]["region"] and raw["provider"]["availability_zone"]
    assert raw["auth"]["ssh_user"]


def test_head_takes_no_work(prepared):
    head = _node_types(prepared)[prepared["head_node_type"]]
    assert head["resources"].get("CPU") == 0
    assert not {"GPU", "trainer"} & set(head["resources"])
    assert head["min_workers"] == 0 and head["max_workers"] == 0


def test_trainer_node_type_has_gpu_and_an_elastic_range(prepared):
    _, trainer = _trainer_type(prepared)
    res = trainer["resources"]
    assert res.get("GPU", 0) >= 1 and res.get("CPU", 0) >= 1
    assert res["trainer"] == res["GPU"], "one `trainer` per GPU: one training worker per GPU"
    assert 1 <= trainer["min_workers"] <= trainer["max_workers"]


def test_decode_node_type_is_cpu_only(prepared):
    head = prepared["head_node_type"]
    trainer, _ = _trainer_type(prepared)
    others = {n: t for n, t in _node_types(prepared).items() if n not in (head, trainer)}
    assert others, "a CPU node type for Ray Data decoding"
    for name, t in others.items():
        assert t["resources"].get("CPU", 0) > 0, name
        assert not {"GPU", "trainer"} & set(t["resources"]), name
        assert 0 <= t["min_workers"] <= t["max_workers"], name


def test_global_max_workers_reaches_every_type_maximum(prepared):
    total = sum(
        t["max_workers"]
        for n, t in _node_types(prepared).items()
        if n != prepared["head_node_type"]
    )
    assert prepared["max_workers"] >= total


def test_setup_installs_torch_ray_and_the_project(raw, prepared):
    torch_spec = re.search(r"TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert torch_spec == "torch==2.13.0"
    setup = "\n".join(raw["setup_commands"])
    # Both branches: the CUDA wheel on GPU nodes, the CPU wheel elsewhere.
    assert setup.count(f"install -q {torch_spec}") == 2
    assert "download.pytorch.org/whl/cpu" in setup
    # The cluster's Ray must be the one that runs `ray up` here.
    assert f"ray[default,train,tune,data]=={ray.__version__}" in setup
    assert re.search(r"pip install -q -e \$HOME/raytrain_vla$", setup, re.M)
    # Setup commands run in order: torch before the project, so pip keeps that torch.
    assert setup.index(torch_spec) < setup.index("-e $HOME/raytrain_vla")
    # The synced project is what `pip install -e` needs, and every local path exists.
    mounts = raw["file_mounts"]
    for remote in ("raytrain_vla", "pyproject.toml", "README.md"):
        assert f"~/raytrain_vla/{remote}" in mounts, remote
    for local in mounts.values():
        assert (ROOT / local).exists(), local
    # boto3 on the head, for the autoscaler.
    assert any("boto3" in c for c in prepared["head_setup_commands"])
    assert any(f"{SHARED})" in c and "mount -t nfs4" in c for c in raw["setup_commands"])


def test_start_commands(raw):
    head = "\n".join(raw["head_start_ray_commands"])
    worker = "\n".join(raw["worker_start_ray_commands"])
    assert "ray start --head" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "--dashboard-host=0.0.0.0" in head and "--object-store-memory=" in head
    assert "ray start --address=$RAY_HEAD_IP:6379" in worker
    for cmds in (head, worker):
        assert "source $HOME/venv/bin/activate" in cmds  # the venv that setup_commands built


def test_readme_job_fits_the_cluster(prepared):
    args = _readme_job()
    config_at = args.index("--config")
    del args[config_at : config_at + 2]  # CFG.yaml is the user's file
    cfg = parse_cli(args)  # unknown keys and bad batch layouts raise ConfigError

    assert cfg.ray.use_gpu
    low, high = cfg.ray.num_workers
    request = cfg.ray.resources_per_worker
    _, trainer = _trainer_type(prepared)
    offer = trainer["resources"]
    assert request.get("trainer", 0) >= 1, "workers must ask for `trainer`"
    assert set(request) <= set(offer), f"{request} asks for what the trainer node lacks"
    per_node = min(int(offer[k] // v) for k, v in request.items() if v > 0)
    assert per_node >= 1, f"{request} does not fit one trainer node {offer}"
    assert trainer["min_workers"] >= math.ceil(low / per_node)
    assert trainer["max_workers"] == math.ceil(high / per_node)

    assert cfg.ray.max_failures > 0, "surviving a node loss needs retries"
    for path in (cfg.ray.storage_path, cfg.data.root):
        assert path.startswith(SHARED + "/"), f"{path} is not on the shared mount"
