#!/usr/bin/env bash
# Download, here, the wheels the GPU machine lacks (it has torch, numpy, pyarrow, pandas,
# safetensors, pyyaml but no Ray, PyAV or draccus, and no package index) into .whl/ for the
# device call to carry. Python 3.12, manylinux x86_64, the versions this project is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" -d .whl ray==2.60.0 av draccus mergedeep pyyaml-include toml typing-inspect
du -sh .whl
