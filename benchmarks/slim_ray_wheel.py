"""Rewrite a Ray wheel without what a Python training job never loads, so it fits one device call.

The GPU machine has no package index and one call carries at most 64 MiB; Ray 2.60's wheel is
79 MB, 31 MB of it the Java runtime (`ray/jars`). Dropped: the Java jars, RLlib, Serve and Ray
LLM. The dashboard stays whole: Ray Train's placement-group cleaner needs its State API, and it
refuses to start without its web client build. RECORD is rewritten to match.

    python benchmarks/slim_ray_wheel.py ray-2.60.0-...whl OUT_DIR
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

DROPPED = ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/")


def slim(wheel: Path, out_dir: Path) -> Path:
    out = out_dir / wheel.name
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = info.filename
            if name.startswith(DROPPED):
                continue
            data = src.read(info)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(ln for ln in lines if not ln.startswith(DROPPED)) + "\n").encode()
            dst.writestr(info, data)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{path} {path.stat().st_size / 2**20:.1f} MiB")
