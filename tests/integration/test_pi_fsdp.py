"""pi0 and pi0.5 under FSDP2 on 2 gloo ranks (no Ray), from LeRobot's tiny checkpoints.

The joint layers (VLM layer i + expert layer i), the SigLIP blocks, the token embedding and the
LM heads are FSDP units that really shard: each rank holds about half of every parameter's
bytes, and the loss and every gradient equal one unsharded process, with and without
activation checkpointing per unit.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _fsdp_step import one_step, sharded_copy
from _spawn import run_distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from _paths import fixtures_root  # noqa: E402

from raytrain_vla import policy  # noqa: E402
from raytrain_vla.config.schema import OptimizerConfig  # noqa: E402
from raytrain_vla.train.optim import freeze_for_config  # noqa: E402


def fixture_batch(variant: str):
    """The fixture's policy (unsharded), its collated training batch, noise and time."""
    import json

    folder = fixtures_root() / f"lerobot_{variant}_tiny"
    loaded = policy.load(folder / "pretrained_model", options={"vision_heads": 2})
    ref = dict(np.load(folder / "reference.npz"))
    info = json.loads((folder / "reference.json").read_text())
    cameras = json.loads((folder / "spec.json").read_text())["cameras"]
    cols = {f"image/{cam}": ref[f"raw.{cam}"] for cam in cameras}
    cols.update(
        state=ref["raw.observation.state"], task=np.array(info["tasks"], dtype=object),
        actions=ref["raw.action"], action_is_pad=ref["raw.action_is_pad"],
    )  # fmt: skip
    encoded = loaded.processor.encode(cols)
    noise, time = torch.from_numpy(ref["train.noise"]), torch.from_numpy(ref["train.time"])
    return loaded, encoded, noise, time


def sharded(
    rank: int, world: int, variant: str, checkpointing: bool, precision: str = "fp32"
) -> dict:
    loaded, encoded, noise, time = fixture_batch(variant)
    model = sharded_copy(variant, loaded.model, rank, world, precision, checkpointing)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    loss, grads = one_step(model, loaded.processor, encoded, noise, time, [rank])
    losses = [torch.zeros(()) for _ in range(world)]
    torch.distributed.all_gather(losses, loss)
    return {
        "local_bytes": torch.tensor(local),
        "whole_bytes": torch.tensor(whole),
        "loss": torch.stack(losses).mean(),
        **{f"grad/{k}": v for k, v in grads.items()},
    }


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_each_rank_holds_half_and_loss_and_gradients_equal_one_process(variant, tmp_path):
    loaded, encoded, noise, time = fixture_batch(variant)
    model = loaded.model
    freeze_for_config(model, OptimizerConfig())
    model.train()
    loss, grads = one_step(model, loaded.processor, encoded, noise, time, [0, 1])
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    for checkpointing in (False, True):
        program = functools.partial(sharded, variant=variant, checkpointing=checkpointing)
        out = run_distributed(program, tmp_path)
        assert int(out["whole_bytes"]) == whole
        share = int(out["local_bytes"]) / whole
        print(f"{variant} checkpointing={checkpointing}: rank 0 holds {share:.3f} of {whole} B")
        assert 0.45 <= share <= 0.55, share
        torch.testing.assert_close(out["loss"], loss, rtol=1e-5, atol=1e-6)
        theirs = {k.removeprefix("grad/"): v for k, v in out.items() if k.startswith("grad/")}
        assert theirs.keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(theirs[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # bf16 compute over fp32 master weights: close to fp32, gradients finite and kept in fp32.
    program = functools.partial(sharded, variant=variant, checkpointing=True, precision="bf16")
    out = run_distributed(program, tmp_path)
    torch.testing.assert_close(out["loss"], loss, rtol=3e-2, atol=3e-2)
    bf16 = {k: v for k, v in out.items() if k.startswith("grad/")}
    assert bf16 and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in bf16.values())
