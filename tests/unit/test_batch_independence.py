"""A sample's loss and gradient must not depend on which other samples share its micro-batch.

Gradient accumulation and world-size independence both rest on this: any coupling (batch
statistics, padding trimmed per batch and seen by a convolution) breaks them silently.
"""

import torch

from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.train.noise import flow_noise_and_time


def _batch(n: int = 6) -> dict:
    g = torch.Generator().manual_seed(0)
    tokens, mask = tokenize(["reach the red disc", "move to the green target", "x"] * (n // 3), 48)
    return {
        "sample_ids": torch.arange(n),
        "images": {"observation.image": torch.rand(n, 3, 32, 32, generator=g)},
        "state": torch.randn(n, 2, generator=g),
        "text_tokens": tokens,
        "text_mask": mask,
        "actions": torch.randn(n, 8, 2, generator=g),
        "action_is_pad": torch.zeros(n, 8, dtype=torch.bool),
    }


def _rows(batch: dict, idx: slice) -> dict:
    out = {k: v[idx] for k, v in batch.items() if k != "images"}
    out["images"] = {k: v[idx] for k, v in batch["images"].items()}
    return out


def test_per_sample_gradients_do_not_depend_on_batch_composition():
    torch.manual_seed(0)
    model = FlowVLA(FlowVLAConfig.from_size("tiny"))
    # Make FiLM non-identity so the instruction path carries gradient everywhere.
    for film in model.vision.stems[0].films:
        torch.nn.init.normal_(film.mlp.fc2.weight, std=0.05)
    batch = _batch()
    noise, time = flow_noise_and_time(0, 0, batch["sample_ids"].tolist(), (8, 2))
    whole = model.compute_loss(batch, noise, time)
    whole.sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    singles = []
    for i in range(len(whole)):
        loss = model.compute_loss(_rows(batch, slice(i, i + 1)), noise[i : i + 1], time[i : i + 1])
        loss.sum().backward()
        singles.append(loss.detach())
    torch.testing.assert_close(torch.cat(singles), whole.detach(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-4, atol=1e-5, msg=name)
