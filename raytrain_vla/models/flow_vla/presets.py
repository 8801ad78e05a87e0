"""flow_vla's size presets: the dims each `model.flow_vla.size` fills, read by its config and
checked against by its options."""

from __future__ import annotations

from typing import Any

# Dims each size fills. tiny: CPU tests/demo (<1M); small: CPU overhead benchmark; base: GPUs.
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, num_heads=2, backbone_layers=2, expert_d_model=64,
                 expert_heads=2, expert_layers=2, vision_channels=(32, 32, 32),
                 vision_strides=(2, 2, 2), film_dim=64),
    "small": dict(d_model=384, num_heads=6, backbone_layers=8, expert_d_model=384,
                  expert_heads=6, expert_layers=6, vision_channels=(64, 128, 256),
                  vision_strides=(2, 2, 2), film_dim=256),
    "base": dict(d_model=2048, num_heads=16, backbone_layers=16, expert_d_model=1024,
                 expert_heads=16, expert_layers=12, vision_channels=(128, 256, 512, 768),
                 vision_strides=(2, 2, 2, 2), film_dim=1024),
}  # fmt: skip
