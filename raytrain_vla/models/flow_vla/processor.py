"""flow_vla's input processor: cameras at the model's size, byte tokens, normalised state/actions."""

from __future__ import annotations

import numpy as np

from raytrain_vla.common.normalize import Normalizer
from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.models.processing import ImageStateProcessor


class FlowVLAProcessor(ImageStateProcessor):
    def __init__(self, config: FlowVLAConfig, normalizer: Normalizer):
        super().__init__(
            list(config.camera_keys), config.image_size, config.state_dim, config.action_dim,
            normalizer,
        )  # fmt: skip
        self.max_text_len = config.max_text_len

    def encode_text(self, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Byte tokens right-padded to `max_text_len` (a fixed shape on every rank and step);
        each distinct instruction is tokenized once (a read task holds few)."""
        unique, row = np.unique(np.asarray(tasks, dtype=str), return_inverse=True)
        tokens, mask = tokenize(unique.tolist(), self.max_text_len)
        return {"text_tokens": tokens.numpy()[row], "text_mask": mask.numpy()[row]}
