"""Model FLOPs for MFU: per-sample, side-effect free, and the peak lookup."""

import torch

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.common.spec import DataSpec
from raytrain_vla.models.registry import get_family
from raytrain_vla.train.flops import example_columns, peak_tflops, training_flops_per_sample

SPEC = DataSpec({"observation.image": (3, 32, 32)}, state_dim=2, action_dim=2, chunk_size=8)
STATS = {"observation.state": {"mean": [0, 0], "std": [1, 1]}}
STATS["action"] = STATS["observation.state"]
FAMILY = get_family("flow_vla")
CONFIG = FAMILY.config_type.from_size("tiny", num_inference_steps=2)


def batch_for(texts: list[str]) -> dict:
    processor = FAMILY.processor(CONFIG, Normalizer.from_stats(STATS, "mean_std"))
    return processor.collate(processor.encode(example_columns(SPEC, texts)), "cpu")


def test_example_batch_has_the_models_input_shapes():
    batch = batch_for(["reach the red disc", "x"])
    assert batch["images"]["observation.image"].shape == (2, 3, 32, 32)
    assert batch["text_tokens"].shape == (2, CONFIG.max_text_len)
    assert batch["actions"].shape == (2, 8, 2) and batch["sample_ids"].tolist() == [0, 1]


def test_flops_per_sample_do_not_depend_on_batch_size_and_leave_no_trace():
    torch.manual_seed(0)
    model = FAMILY.build(CONFIG)
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
