"""`python -m raytrain_vla.report RUN_DIR`: PNG plots of a run, written to RUN_DIR/report/
(RUN_DIR may be an object-store URI, `s3://bucket/runs/NAME`).

* `training.png`: train and validation loss, LR per group, grad norm (total and per group),
  samples/s, the share of step time spent waiting for data, and the validation action MSE per
  action dimension next to the mean-action baseline; for a mixture, each dataset's validation
  loss, its share of the samples drawn and its MSE relative to its own mean action.
* `predictions.png`: predicted vs true action chunks of a few held-out samples, from the run's
  exported policy (skipped, with a note, when the run has no export or its dataset is gone).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# Figures without pyplot: headless-safe, and importing this never changes a notebook's backend.
from matplotlib.figure import Figure

from raytrain_vla.common.run_storage import RunPath, is_remote, run_path


def read_metrics(run_dir: RunPath) -> dict[str, list[dict]]:
    """Rows by kind, one per step: a step redone after a restart keeps its last record."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (missing metrics.jsonl)")
    latest: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        latest[(row["kind"], row["step"])] = row
    out: dict[str, list[dict]] = {"train": [], "val": []}
    for (kind, _), row in sorted(latest.items(), key=lambda kv: kv[0][1]):
        out.setdefault(kind, []).append(row)
    return out


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], r[key]) for r in rows if key in r]
    return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts], dtype=float))


def _keys(rows: list[dict], prefix: str) -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith(prefix)})


def plot_training(metrics: dict[str, list[dict]], out: Path) -> Path:
    train, val = metrics["train"], metrics["val"]
    fig = Figure(figsize=(15, 8), layout="constrained")
    axes = fig.subplots(2, 3)
    ax = axes[0, 0]
    ax.plot(*_series(train, "loss"), label="train (flow matching)", lw=0.8)
    ax.plot(*_series(val, "val_loss"), "o-", label="validation", ms=3)
    for key in _keys(val, "val_loss/"):  # a mixture's datasets
        ax.plot(*_series(val, key), ".--", label=f"validation {key[9:]}", ms=3)
    ax.set(title="loss", xlabel="step", yscale="log")
    ax.legend()
    ax = axes[0, 1]
    for key in _keys(train, "lr/"):
        ax.plot(*_series(train, key), label=key[3:])
    ax.set(title="learning rate per group", xlabel="step")
    ax.legend()
    ax = axes[0, 2]
    ax.plot(*_series(train, "grad_norm"), label="total", lw=0.8, color="k")
    for key in _keys(train, "grad_norm/"):
        ax.plot(*_series(train, key), label=key[10:], lw=0.6)
    ax.set(title="gradient norm (before clipping)", xlabel="step", yscale="log")
    ax.legend()
    ax = axes[1, 0]
    ax.plot(*_series(train, "samples_per_s"))
    ax.set(title="throughput", xlabel="step", ylabel="samples/s")
    mixture = _keys(train, "samples/")
    if mixture:  # each dataset's share of the samples drawn so far, on the right axis
        share = ax.twinx()
        steps = _series(train, mixture[0])[0]
        total = sum(_series(train, k)[1] for k in mixture)
        for key in mixture:
            share.plot(steps, _series(train, key)[1] / np.maximum(total, 1), ":", label=key[8:])
        share.set(ylabel="share of samples", ylim=(0, 1))
        share.legend(fontsize=7)
    ax = axes[1, 1]
    ax.plot(*_series(train, "data_wait_share"))
    ax.set(title="share of step time waiting for data", xlabel="step", ylim=(0, 1))
    ax = axes[1, 2]
    if _keys(val, "val_mse_ratio/"):  # a mixture: each robot against its own mean action
        for key in _keys(val, "val_mse_ratio/"):
            ax.plot(*_series(val, key), "o-", ms=3, label=key[14:])
        ax.set(title="validation MSE / mean-action MSE per dataset", xlabel="step", yscale="log")
        ax.legend()
        path = out / "training.png"
        fig.savefig(path, dpi=110)
        return path
    for key in [k for k in _keys(val, "val_action_mse/")]:
        ax.plot(*_series(val, key), "o-", ms=3, label=f"action dim {key.rsplit('/', 1)[1]}")
    baseline = _series(val, "val_mean_action_mse")
    ax.plot(*baseline, "s--", ms=3, color="gray", label="mean-action baseline")
    ax.set(title="validation action MSE (original units)", xlabel="step", yscale="log")
    ax.legend()
    path = out / "training.png"
    fig.savefig(path, dpi=110)
    return path


def plot_predictions(run_dir: RunPath, out: Path, count: int = 4) -> Path:
    """Predicted vs true chunks for held-out samples, through the exported policy."""
    import yaml

    from raytrain_vla import policy as policy_lib
    from raytrain_vla.config import from_tree
    from raytrain_vla.data.mixture import MixtureView, open_view
    from raytrain_vla.train.resume import latest_checkpoint

    export = run_dir / "export"
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None or not (export / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run_dir}: no export or checkpoint to predict with")
    cfg = from_tree(yaml.safe_load((ckpt / "config.yaml").read_text()), str(ckpt / "config.yaml"))
    view = open_view(cfg.data, cfg.train.seed, cfg.train.global_batch_size)
    policy = policy_lib.load(export, seed=0)
    # (dataset view, embodiment name) per panel: a mixture's datasets take turns.
    if isinstance(view, MixtureView):
        panels = [
            (view.views[i % len(view.names)], view.names[i % len(view.names)]) for i in range(count)
        ]
    else:
        panels = [(view, None)] * count
    fig = Figure(figsize=(4 * count, 4), layout="constrained")
    axes = fig.subplots(1, count)
    for i, ax in enumerate(np.atleast_1d(axes)):
        one, name = panels[i]
        sample = int(one.val_ids[(len(one.val_ids) - 1) * i // max(count - 1, 1)])
        cols = one.source.read(np.array([sample]))
        obs = {key: cols[f"image/{key}"][0].transpose(1, 2, 0) for key in one.spec.camera_keys}
        obs.update({"observation.state": cols["state"][0], "task": str(cols["task"][0])})
        pred = policy.predict_action_chunk(obs, embodiment=name)
        true = np.asarray(cols["actions"][0])
        valid = ~np.asarray(cols["action_is_pad"][0])
        for d in range(true.shape[1]):
            line = ax.plot(np.flatnonzero(valid), true[valid, d], "o-", ms=3, label=f"true {d}")
            ax.plot(pred[:, d], "x--", color=line[0].get_color(), label=f"predicted {d}")
        where = f"{name}:{sample}" if name else f"sample {sample}"
        ax.set(title=f"{where}: {obs['task'][:28]}", xlabel="chunk step")
        if i == 0:
            ax.legend(fontsize=7)
    path = out / "predictions.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_vla.report", description=__doc__)
    parser.add_argument("run_dir", type=_run_dir, help="a run directory, or its URI")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        metrics = read_metrics(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    with _report_dir(args.run_dir) as (out, shown):
        print(shown(plot_training(metrics, out)))
        try:
            print(shown(plot_predictions(args.run_dir, out)))
        except (FileNotFoundError, ValueError) as err:
            print(f"note: predictions.png skipped: {err}", file=sys.stderr)
    return 0


def _run_dir(text: str) -> RunPath:
    return run_path(text) if is_remote(text) else Path(text)


@contextmanager
def _report_dir(run_dir: RunPath) -> Iterator[tuple[Path, Callable[[Path], object]]]:
    """(where to draw, how to name a figure): RUN_DIR/report; for a run in object storage a
    local directory, uploaded to RUN_DIR/report as each figure is named."""
    if not is_remote(run_dir):
        out = Path(run_dir) / "report"
        out.mkdir(exist_ok=True)
        yield out, lambda path: path
        return
    remote = run_dir / "report"

    def upload(path: Path) -> object:
        remote.fs.put_file(str(path), (remote / path.name).path)
        return remote / path.name

    with tempfile.TemporaryDirectory(prefix="raytrain_vla-") as tmp:
        yield Path(tmp), upload


if __name__ == "__main__":
    sys.exit(main())
