"""What the checkpoint manifest costs: `save_checkpoint` with and without it, as a ratio.

The `small` flow_vla with AdamW state (one step taken), saved in one process into fresh
directories; the two variants alternate so drift in disk speed hits both alike. The manifest
reads every file back once for its CRC32, so its cost is the read of what was just written
(from the page cache here). Prints JSON.

    python benchmarks/checkpoint_manifest.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.registry import get_family
from raytrain_vla.policy.format import PolicyMeta
from raytrain_vla.train import checkpoint
from raytrain_vla.train.train_state import TrainState

STATS = {f: {"mean": [0.0, 0.0], "std": [1.0, 1.0]} for f in ("observation.state", "action")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.manual_seed(0)
    config = FlowVLAConfig.from_size(args.size)
    model = get_family("flow_vla").build(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()  # Adam moments exist, as in a real checkpoint
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    spec = DataSpec({"observation.image": (3, 32, 32)}, 2, 2, config.chunk_size)
    meta = PolicyMeta("flow_vla", config, spec)
    state = TrainState(
        step=1, epoch=0, sample_in_epoch=0, samples_seen=64, world_size=1, run_name="bench",
        config_hash="-", dataset_fingerprint="-",
    )  # fmt: skip
    normalizer = Normalizer.from_stats(STATS, "mean_std")

    def save(directory: Path) -> float:
        start = time.perf_counter()
        checkpoint.save_checkpoint(
            directory, model, optimizer, scheduler, state, 0, "{}\n", normalizer, meta
        )
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        save(Path(tmp) / "warmup")
        for i in range(args.repeats):
            times["with"].append(save(Path(tmp) / f"with{i}"))
            with mock.patch.object(checkpoint, "write_manifest", lambda *_: None):
                times["without"].append(save(Path(tmp) / f"without{i}"))
        size_mb = sum(f.stat().st_size for f in (Path(tmp) / "with0").rglob("*") if f.is_file())
    ratios = [a / b for a, b in zip(times["with"], times["without"], strict=True)]
    print(
        json.dumps(
            {
                "size": args.size,
                "params": sum(p.numel() for p in model.parameters()),
                "checkpoint_mb": round(size_mb / 2**20, 1),
                "save_s_with_manifest": round(statistics.median(times["with"]), 4),
                "save_s_without": round(statistics.median(times["without"]), 4),
                "ratio_median": round(statistics.median(ratios), 4),
                "repeats": args.repeats,
            }
        )
    )


if __name__ == "__main__":
    main()
