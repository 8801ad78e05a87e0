"""One local Ray cluster for the whole integration session, and a small shared demo dataset."""

from __future__ import annotations

import pytest
import ray
from _runs import short_run_args

from raytrain_vla.data.demo import write_demo_dataset


@pytest.fixture(scope="session")
def ray_cluster():
    # Logical CPUs beyond the 2 training workers so Ray Data read tasks never starve.
    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("data") / "demo", num_episodes=60, seed=0)


@pytest.fixture()
def run_args(demo_root, tmp_path):
    """Overrides for a short tiny-model run on the shared dataset, writing under tmp_path."""

    def make(name: str, steps: int, *extra: str) -> list[str]:
        return short_run_args(demo_root, tmp_path / "runs", name, steps, *extra)

    return make
