"""`notebooks/quickstart.ipynb` runs clean, top to bottom, in a headless kernel."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs_headless(ray_cluster, tmp_path, monkeypatch):
    # The kernel inherits this environment: a small tour, written under tmp_path, on the
    # session's cluster rather than a second one.
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path / "quickstart"))
    monkeypatch.setenv("QUICKSTART_EPISODES", "40")
    monkeypatch.setenv("QUICKSTART_STEPS", "8")
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback
    finally:
        nbformat.write(notebook, tmp_path / "quickstart.executed.ipynb")  # to look at after

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # Frame grid, trajectories, training curves, predicted vs true chunks, rollout strips.
    assert len(images) == 5, f"expected the tour's 5 figures, got {len(images)}"
    # run.main's summary line carries the closed-loop scores of the run's own evaluation.
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    summary = json.loads(text.split("summary: ", 1)[1].splitlines()[0])
    assert set(summary["closed_loop_success"]) == {"policy", "random", "instruction_blind"}
    run_dir = tmp_path / "quickstart" / "runs" / "quickstart_40_8"
    assert (run_dir / "export" / "model.safetensors").is_file()
    assert (run_dir / "report" / "training.png").is_file()
    assert sorted(p.suffix for p in (run_dir / "rollouts").iterdir()) == [".mp4"] * 3 + [".png"] * 3


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
