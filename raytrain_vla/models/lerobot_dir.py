"""LeRobot policy directories (`pretrained_model/`), recognised by their `config.json` alone.

Light on purpose (json and pathlib): a family's options consult it while the config is loaded,
before torch or transformers are imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = "config.json"


def lerobot_config(path: str | Path) -> dict[str, Any] | None:
    """The `config.json` of a LeRobot policy directory (it names a policy `type` and has none of
    our policy `format`), else None."""
    try:
        data = json.loads((Path(path).expanduser() / CONFIG).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and "type" in data and "format" not in data:
        return data
    return None
