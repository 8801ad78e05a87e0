"""`python -m raytrain_vla.data stats`: Ray Data stats agree with the demo writer's exact stats."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from raytrain_vla.data.stats import write_stats

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_stats_recomputed_with_ray_data_match_the_writer(demo_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(demo_root, root)
    stats_path = root / "meta" / "stats.json"
    reference = json.loads(stats_path.read_text())
    assert write_stats(root) == (stats_path, False)  # complete stats are left alone
    stats_path.write_text(json.dumps({"observation.image": reference["observation.image"]}))
    path, written = write_stats(root)
    assert written and path == stats_path
    got = json.loads(stats_path.read_text())
    assert got["observation.image"] == reference["observation.image"]  # other entries kept
    for feat in ("observation.state", "action"):
        for key in ("mean", "std", "min", "max", "q01", "q99", "count"):
            np.testing.assert_allclose(
                got[feat][key], reference[feat][key], rtol=1e-5, atol=1e-7, err_msg=f"{feat}/{key}"
            )
