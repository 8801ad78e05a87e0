"""Wall-OSS (`wall_x`) under FSDP2 on 2 gloo ranks (no Ray), from LeRobot's tiny checkpoint.

The vision blocks and merger, the token embedding and each decoder layer (attention and both
experts) are FSDP units that really shard: each rank holds about half of every parameter's
bytes, and the loss and every gradient equal one unsharded process, with and without activation
checkpointing per unit; bf16 compute keeps fp32 master gradients.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch
from _fsdp_step import one_step, sharded_copy
from _spawn import run_distributed
from torch.distributed.fsdp import FSDPModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _paths import fixtures_root  # noqa: E402

from raytrain_vla import policy  # noqa: E402
from raytrain_vla.config.schema import OptimizerConfig  # noqa: E402
from raytrain_vla.train.optim import freeze_for_config  # noqa: E402


def fixture_batch():
    """The fixture's policy in float32 (unsharded), its encoded raw batch, noise and time."""
    folder = fixtures_root() / "lerobot_wallx_tiny"
    loaded = policy.load(folder / "pretrained_model")
    loaded.model.float()
    ref = dict(np.load(folder / "reference.npz"))
    info = json.loads((folder / "reference.json").read_text())
    cameras = json.loads((folder / "spec.json").read_text())["cameras"]
    cols = {
        f"image/{cam}": (torch.from_numpy(ref[f"raw.{cam}"]) * 255).to(torch.uint8).numpy()
        for cam in cameras
    }
    cols.update(
        state=ref["raw.observation.state"], task=np.array(info["tasks"], dtype=object),
        actions=ref["raw.action"], action_is_pad=ref["raw.action_is_pad"],
    )  # fmt: skip
    encoded = loaded.processor.encode(cols)
    noise, time = torch.from_numpy(ref["train.noise"]), torch.from_numpy(ref["train.time"])
    return loaded, encoded, noise, time


def sharded(rank: int, world: int, checkpointing: bool, precision: str = "fp32") -> dict:
    loaded, encoded, noise, time = fixture_batch()
    model = sharded_copy("wall_x", loaded.model, rank, world, precision, checkpointing)
    units = {
        name: sum(p.to_local().numel() for p in unit.parameters()) / sum(
            p.numel() for p in unit.parameters())
        for name, unit in [("vision_block", model.visual.blocks[0]), ("merger", model.visual.merger),
                           ("embed_tokens", model.embed_tokens), ("layer", model.layers[0])]
    }  # fmt: skip
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    loss, grads = one_step(model, loaded.processor, encoded, noise, time, [rank])
    losses = [torch.zeros(()) for _ in range(world)]
    torch.distributed.all_gather(losses, loss)
    return {
        "units_are_fsdp_groups": all(isinstance(u, FSDPModule) for u in model.fsdp_units()),
        "local_bytes": torch.tensor(local),
        "whole_bytes": torch.tensor(whole),
        "unit_shares": units,
        "loss": torch.stack(losses).mean(),
        **{f"grad/{k}": v for k, v in grads.items()},
    }


def test_each_rank_holds_half_and_loss_and_gradients_equal_one_process(tmp_path):
    loaded, encoded, noise, time = fixture_batch()
    model = loaded.model
    freeze_for_config(model, OptimizerConfig())
    model.train()
    loss, grads = one_step(model, loaded.processor, encoded, noise, time, [0, 1])
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    for checkpointing in (False, True):
        out = run_distributed(functools.partial(sharded, checkpointing=checkpointing), tmp_path)
        assert out["units_are_fsdp_groups"]  # gathered one at a time, not as one whole model
        assert int(out["whole_bytes"]) == whole
        share = int(out["local_bytes"]) / whole
        print(f"wall_x checkpointing={checkpointing}: rank 0 holds {share:.3f} of {whole} B")
        assert 0.45 <= share <= 0.55, share
        for unit, unit_share in out["unit_shares"].items():  # each kind of unit shards
            assert 0.4 <= unit_share <= 0.6, (unit, unit_share)
        torch.testing.assert_close(out["loss"], loss, rtol=1e-5, atol=1e-6)
        theirs = {k.removeprefix("grad/"): v for k, v in out.items() if k.startswith("grad/")}
        assert theirs.keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(theirs[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # bf16 compute over fp32 master weights: close to fp32, gradients finite and kept in fp32.
    out = run_distributed(
        functools.partial(sharded, checkpointing=True, precision="bf16"), tmp_path
    )
    torch.testing.assert_close(out["loss"], loss, rtol=5e-2, atol=5e-2)
    bf16 = {k: v for k, v in out.items() if k.startswith("grad/")}
    assert bf16 and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in bf16.values())
