"""Byte-level tokenizer: no vocabulary file to ship, download or keep in sync with a checkpoint."""

from __future__ import annotations

import torch

PAD_ID = 0
VOCAB_SIZE = 257  # 256 byte values shifted by one, plus the padding id 0


def tokenize(texts: list[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode texts as utf-8 bytes + 1, truncated and right-padded to exactly ``max_len``.

    A fixed length keeps tensor shapes identical on every rank and step (no data-dependent
    recompiles or numerics). Returns ``(tokens (B, max_len) long, mask (B, max_len) bool)``
    where ``mask`` is True on real tokens.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    tokens = torch.zeros(len(texts), max_len, dtype=torch.long)
    for i, text in enumerate(texts):
        data = text.encode("utf-8")[:max_len]
        if data:
            tokens[i, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).long() + 1
    return tokens, tokens != PAD_ID


def detokenize(tokens: torch.Tensor) -> list[str]:
    """Inverse of :func:`tokenize` (padding dropped); handy for debugging batches."""
    out = []
    for row in tokens.tolist():
        out.append(bytes(t - 1 for t in row if t != PAD_ID).decode("utf-8", errors="replace"))
    return out
