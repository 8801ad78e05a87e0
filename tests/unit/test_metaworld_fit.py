"""benchmarks/metaworld_fit.py scores what it says: chunk targets padded as the trainer pads,
episodes split as the trainer splits them, and a policy that always answers the training
episodes' mean action scores `mse_ratio` 1 on them. No Ray; a fresh tiny policy, seconds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from _paths import fixtures_root

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.data.dataset import split_episodes
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.policy.format import PolicyMeta, write_policy

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "metaworld_fit.py"


def load_script():
    spec = importlib.util.spec_from_file_location("metaworld_fit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chunk_targets_pad_with_the_last_action_and_mark_it():
    actions = np.arange(10, dtype=np.float32).reshape(5, 2)
    target, valid = load_script().chunk_targets(actions, np.array([0, 3]), chunk=4)
    assert target.shape == (2, 4, 2)
    np.testing.assert_array_equal(target[0], actions[:4])
    np.testing.assert_array_equal(target[1], actions[[3, 4, 4, 4]])
    np.testing.assert_array_equal(valid, [[True] * 4, [True, True, False, False]])


@pytest.fixture(scope="module")
def dataset() -> Path:
    return fixtures_root() / "lerobot_v3" / "pusht_like_images"


def mean_policy(dataset: Path, out: Path, mean: np.ndarray) -> Path:
    """A flow_vla whose velocity is zero (so it returns its noise) and whose action std is
    ~0: it answers `mean` whatever it sees."""
    config = FlowVLAConfig.from_size("tiny", image_size=(16, 16), num_inference_steps=2)
    spec = DataSpec({"observation.image": (3, 64, 64)}, state_dim=2, action_dim=2, chunk_size=8)
    meta = PolicyMeta("flow_vla", config, spec, ("push the T",), (0.0, 0.0))
    model = FlowVLA(config)
    with torch.no_grad():
        model.action_expert.action_out.weight.zero_()
        model.action_expert.action_out.bias.zero_()
    stats = {
        "observation.state": {"mean": [0.0, 0.0], "std": [1.0, 1.0]},
        "action": {"mean": mean.tolist(), "std": [1e-9, 1e-9]},
    }
    write_policy(out, model.state_dict(), meta, Normalizer.from_stats(stats, "mean_std"))
    return out


def test_a_policy_answering_the_mean_action_scores_one_on_its_training_episodes(dataset, tmp_path):
    table = pq.read_table(sorted((dataset / "data").rglob("*.parquet")))
    episode = table.column("episode_index").to_numpy()
    actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
    held_out = split_episodes(int(episode.max()) + 1, 0.05, [])
    train_mean = actions[~np.isin(episode, held_out)].mean(0)
    policy = mean_policy(dataset, tmp_path / "export", train_mean)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(policy), "--dataset", str(dataset), "--stride", "3",
         "--unseen", str(dataset)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report) == 4  # the fixture's three tasks, one episode each, and "all"
    task = report["all"]
    assert task["train"]["episodes"] + task["held_out"]["episodes"] == 3
    assert task["held_out"]["episodes"] == len(held_out) == 1
    lengths = np.bincount(episode)
    expected = {
        "train": sum(-(-n // 3) for e, n in enumerate(lengths) if e not in held_out),
        "held_out": sum(-(-n // 3) for e, n in enumerate(lengths) if e in held_out),
    }
    assert {s: task[s]["frames"] for s in expected} == expected
    assert task["train"]["mse_ratio"] == pytest.approx(1.0, abs=2e-3)
    # --unseen scores every episode of its dataset, against the training episodes' mean
    assert task["unseen"]["frames"] == expected["train"] + expected["held_out"]
    assert task["unseen"]["episodes"] == 3
    assert task["train"]["first_xyz_error"] > 0.0
