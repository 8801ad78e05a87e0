"""A family is one package plus one registration line: the toy family, chosen in a YAML file
alone, trains through `run.main` on 2 Ray workers (FSDP2), exports, and loads as a policy that
predicts what the run's export predicts, with nothing in train/, policy/ or data/ naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from raytrain_vla import export, policy, run

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_the_toy_family_trains_exports_and_loads_from_a_yaml_file(run_args, tmp_path):
    config = tmp_path / "toy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"type": "toy_mlp", "toy_mlp": {"hidden": 24, "pool": 4}},
                "optimizer": {"lr": 3e-3},
            }
        )
    )
    args = run_args("toy", 6, "--train.val_interval=6")
    assert run.main(["--config", str(config), *args]) == 0
    run_dir = tmp_path / "runs" / "toy"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert {"lr/vision", "lr/backbone", "lr/action_expert"} <= records[0].keys()  # its roles

    checkpoint = max(p for p in run_dir.glob("checkpoint_*") if p.is_dir())
    meta = json.loads((checkpoint / "policy.json").read_text())
    assert meta["model_type"] == "toy_mlp" and meta["model_config"]["hidden"] == 24
    assert export.main([str(checkpoint), str(tmp_path / "from_checkpoint")]) == 0
    run_export = policy.load(run_dir / "export", seed=0)
    again = policy.load(tmp_path / "from_checkpoint", seed=0)
    assert type(run_export.model).__name__ == "ToyMLP"
    np.testing.assert_array_equal(
        load_file(str(tmp_path / "from_checkpoint" / "model.safetensors"))["eye.weight"],
        load_file(str(run_dir / "export" / "model.safetensors"))["eye.weight"],
    )
    camera = run_export.camera_keys[0]
    c, h, w = run_export.camera_shapes[camera]
    obs = {
        camera: np.full((h, w, c), 90, np.uint8),
        "observation.state": np.zeros(run_export.state_dim, np.float32),
        "task": "reach the red disc",
    }
    chunk = run_export.predict_action(obs)
    assert chunk.shape == (8, run_export.action_dim) and np.isfinite(chunk).all()
    np.testing.assert_array_equal(again.predict_action(obs), chunk)
