"""Training on a dataset in object storage (a local S3 server) reads the batches and learns the
weights that the same files on disk give, and the data commands work on it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from raytrain_vla import cli, run
from raytrain_vla.data import __main__ as data_cli
from raytrain_vla.data.formats.location import as_path

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _sample_ids(run_dir: Path) -> dict[tuple[int, int], list[int]]:
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["rank"]): r["ids"] for r in rows}


def test_training_on_s3_matches_training_on_disk(s3_server, demo_root, run_args, tmp_path):
    uri = s3_server.upload(demo_root, "demo_e2e")
    debug = "--debug.log_sample_ids=true"
    assert run.main(run_args("disk", 4, debug)) == 0
    assert run.main(run_args("s3", 4, debug, f"--data.root={uri}")) == 0
    runs = tmp_path / "runs"
    assert _sample_ids(runs / "s3") == _sample_ids(runs / "disk")
    disk = load_file(str(runs / "disk" / "export" / "model.safetensors"))
    s3 = load_file(str(runs / "s3" / "export" / "model.safetensors"))
    assert disk.keys() == s3.keys()
    for key in disk:
        np.testing.assert_array_equal(s3[key], disk[key], err_msg=key)


def test_stats_and_inspect_work_on_s3(s3_server, demo_root, capsys):
    uri = s3_server.upload(demo_root, "demo_stats")
    stats = as_path(uri) / "meta" / "stats.json"
    stats.unlink()
    assert data_cli.main(["stats", uri]) == 0
    got = json.loads(stats.read_text())
    want = json.loads((demo_root / "meta" / "stats.json").read_text())
    for feat in ("observation.state", "action"):
        np.testing.assert_allclose(got[feat]["mean"], want[feat]["mean"], rtol=1e-6)
        np.testing.assert_allclose(got[feat]["max"], want[feat]["max"], rtol=1e-6)
    capsys.readouterr()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = "raytrain-vla data inspect s3://robot-data/so100_pick_place"
    assert line in readme  # the README's command, on this server's copy
    fresh = s3_server.upload(demo_root, "demo_inspect")  # stats as the writer made them
    assert cli.main(line.replace("s3://robot-data/so100_pick_place", fresh).split()[1:]) == 0
    assert "no problems found" in capsys.readouterr().out
