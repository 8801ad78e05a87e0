"""One local Ray cluster for the whole integration session, and a small shared demo dataset."""

from __future__ import annotations

import pytest
import ray

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
        return [
            f"--data.root={demo_root}",
            "--data.val_fraction=0.1",
            "--data.val_max_samples=64",
            f"--train.steps={steps}",
            "--train.global_batch_size=16",
            "--train.micro_batch_size=8",
            "--train.log_interval=1",
            "--train.val_interval=1000",
            "--train.save_interval=3",
            "--scheduler.type=constant",
            "--scheduler.warmup_steps=2",
            f"--ray.storage_path={tmp_path / 'runs'}",
            f"--ray.run_name={name}",
            "--logging.wandb_mode=disabled",
            "--logging.console=false",
            *extra,
        ]

    return make
