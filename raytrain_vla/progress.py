"""Progress bars (tqdm) for the commands that run longer than a few seconds.

Shown on a terminal; in logs (CI, `ray job submit`) only with RAYTRAIN_VLA_PROGRESS=1, and
RAYTRAIN_VLA_PROGRESS=0 hides them everywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(
    items: Iterable[T], desc: str, unit: str = "it", total: int | None = None
) -> Iterable[T]:
    setting = os.environ.get("RAYTRAIN_VLA_PROGRESS")
    disable = None if setting is None else setting == "0"  # None: only on a terminal
    return tqdm(items, desc=desc, unit=unit, total=total, disable=disable, file=sys.stderr)
