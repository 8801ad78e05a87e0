"""Where the shared test fixtures live: `<repo>/../shared/fixtures` in CI, `/work/shared` here.

A test that needs them is skipped where they are absent (a contributor's clone), but under
`CI=true` it fails instead: a CI job that lost its fixtures must not pass by skipping the
tests that compare with LeRobot.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

CANDIDATES = (
    Path(__file__).resolve().parents[3] / "shared" / "fixtures",
    Path("/work/shared/fixtures"),
)


def in_ci() -> bool:
    """`CI=true` (GitHub Actions, GitLab and most CI services set it; `1` counts too)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def missing_fixture(folder: str) -> NoReturn:
    """Skip the calling test (or module) naming `folder`, or fail it under `CI=true`."""
    message = f"shared test fixtures not found: {folder}"
    if in_ci():
        pytest.fail(
            f"{message} (CI=true: a test that needs them fails, never skips)", pytrace=False
        )
    pytest.skip(f"{message} (set CI=true to fail instead)", allow_module_level=True)


def fixtures_root() -> Path:
    """The shared fixtures folder; when neither location exists, `missing_fixture`."""
    for candidate in CANDIDATES:
        if candidate.is_dir():
            return candidate
    missing_fixture(" or ".join(str(c) for c in CANDIDATES))
