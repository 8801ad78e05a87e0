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


def checkpoint_chunk_size(init_from: str, default: int, default_source: str) -> tuple[int, str]:
    """A LeRobot checkpoint's own `chunk_size` (LeRobot fine-tunes with it) and where it came
    from, else `default`; for a family's `default_chunk_size`."""
    data = lerobot_config(init_from) if init_from else None
    chunk = data.get("chunk_size") if data else None
    if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0:
        return chunk, f"the chunk_size of model.init_from's {CONFIG}"
    return default, default_source
