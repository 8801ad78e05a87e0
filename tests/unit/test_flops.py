"""Model FLOPs for MFU: per-sample, side-effect free, and the peak lookup."""

import torch

from raytrain_vla.models.registry import build_model
from raytrain_vla.models.tokenizer import tokenize
from raytrain_vla.train.flops import example_batch, peak_tflops, training_flops_per_sample

KW = dict(
    size="tiny", camera_keys=["observation.image"], image_size=[32, 32], state_dim=2,
    action_dim=2, chunk_size=8, max_text_len=48, num_inference_steps=2,
)  # fmt: skip


def batch_for(texts: list[str]) -> dict:
    tokens, mask = tokenize(texts, 48)
    return example_batch(
        tokens, mask, ["observation.image"], [32, 32], 2, 2, 8, torch.device("cpu")
    )


def test_flops_per_sample_do_not_depend_on_batch_size_and_leave_no_trace():
    torch.manual_seed(0)
    model = build_model("flow_vla", KW)
    one = training_flops_per_sample(model, batch_for(["reach the red disc"]))
    rng = torch.get_rng_state()
    four = training_flops_per_sample(model, batch_for(["reach the red disc"] * 4))
    assert one == four > 0
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())
    # Forward + backward is about 3x forward x 2 FLOPs per multiply-add: at least 6 x params.
    params = sum(p.numel() for p in model.parameters())
    assert one > 6 * params * 0.5
    # A longer instruction means a longer sequence and more FLOPs.
    assert training_flops_per_sample(model, batch_for(["reach the red disc " * 2])) > one


def test_peak_tflops():
    assert peak_tflops(torch.device("cpu"), "bf16") == 0.0
    assert peak_tflops(torch.device("cpu"), "bf16", override=100.0) == 100.0
