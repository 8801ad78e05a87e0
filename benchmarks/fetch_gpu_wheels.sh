#!/usr/bin/env bash
# Download, here, what the GPU machine lacks (it has torch, numpy, pyarrow, pandas, safetensors,
# pyyaml, click, msgpack, protobuf, requests, aiohttp, grpcio, but not Ray, PyAV, draccus,
# jsonschema or pydantic, and no package index), as wheels for the device calls to carry.
# Python 3.12, manylinux x86_64, the versions this project is tested with.
#
# One call carries at most 64 MiB, so the wheels come in two folders of under 50 MiB each:
#   .whl/a  PyAV, draccus, jsonschema, pydantic and their small dependencies (~37 MiB)
#   .whl/b  Ray, rewritten without its Java jars, RLlib, Serve and LLM (~42 MiB)
# Call 1 carries .whl/a and runs `bash benchmarks/gpu_check.sh --stage` (installs only); call 2,
# on the still-warm machine (it is given back after 30 s idle), carries .whl/b and runs the check.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/a .whl/b .whl/full
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" "$@"
}
download -d .whl/a av draccus mergedeep pyyaml-include toml \
  jsonschema jsonschema-specifications referencing rpds-py \
  pydantic pydantic-core annotated-types typing-inspection tensorboardX
download -d .whl/full ray==2.60.0
python3 benchmarks/slim_ray_wheel.py .whl/full/ray-*.whl .whl/b
rm -rf .whl/full
du -sh .whl/a .whl/b
