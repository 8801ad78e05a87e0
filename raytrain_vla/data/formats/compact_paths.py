"""File paths as a few patterns and a table of numbers, for what read tasks carry.

A read task names every file its samples come from. In a large dataset each sample may sit in
a file of its own, and the path strings (root, camera key, chunk and file or episode numbers)
were most of the bytes a task was sent. Dataset paths differ only in their numbers, so a list
of them is stored as its distinct patterns (the path with each run of digits made a field of
that run's width) plus one row of integers per path: a few bytes a file whatever the root or
key names, and exactly the same strings back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

_DIGITS = re.compile(r"\d+")
_MAX_FIELD_DIGITS = 18  # longer runs stay literal text: they may not fit an int64


def _split(path: str) -> tuple[str, list[int]]:
    """(pattern, numbers): `pattern.format(*numbers) == path`."""
    parts, numbers, last = [], [], 0
    for match in _DIGITS.finditer(path):
        run = match.group()
        if len(run) > _MAX_FIELD_DIGITS:
            continue
        parts.append(path[last : match.start()].replace("{", "{{").replace("}", "}}"))
        parts.append(f"{{:0{len(run)}d}}")
        numbers.append(int(run))
        last = match.end()
    parts.append(path[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(parts), numbers


@dataclass(frozen=True, eq=False)
class CompactPaths(Sequence[str]):
    """An immutable list of path strings, stored as patterns and numbers."""

    patterns: tuple[str, ...]
    pattern_of: np.ndarray  # per path: index into patterns
    numbers: np.ndarray  # (paths, most fields), the smallest integer type that holds them

    @classmethod
    def of(cls, paths: Sequence[str]) -> CompactPaths:
        pattern_id: dict[str, int] = {}
        pattern_of, rows = [], []
        for path in paths:
            pattern, numbers = _split(str(path))
            pattern_of.append(pattern_id.setdefault(pattern, len(pattern_id)))
            rows.append(numbers)
        width = max((len(r) for r in rows), default=0)
        table = np.zeros((len(rows), width), np.int64)
        for i, row in enumerate(rows):
            table[i, : len(row)] = row
        for dtype in (np.uint8, np.uint16, np.uint32):
            if table.size == 0 or table.max() <= np.iinfo(dtype).max:
                table = table.astype(dtype)
                break
        kind = np.uint8 if len(pattern_id) <= 256 else np.uint32
        return cls(tuple(pattern_id), np.asarray(pattern_of, kind), table)

    def __len__(self) -> int:
        return len(self.pattern_of)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        pattern = self.patterns[int(self.pattern_of[i])]
        return pattern.format(*self.numbers[i].tolist())

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))
