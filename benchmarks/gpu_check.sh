#!/usr/bin/env bash
# GPU check (issue 7): nccl FSDP2 gradients, then base-model bf16 throughput, MFU, peak memory
# and data-wait share through raytrain_vla on Ray against a plain torch loop. JSON to $OUT.
#
#   bash benchmarks/gpu_check.sh            # on one H200, under 8 minutes
#   bash benchmarks/gpu_check.sh --dry-run  # on CPU: tiny model, a few steps (tests run this)
#
# The GPU machine has torch but not Ray, PyAV or draccus and cannot reach a package index:
# `bash benchmarks/fetch_gpu_wheels.sh` downloads them here into .whl/ (git-ignored), and the
# device call carries .whl. Without a .whl folder the current interpreter is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python  # this project's venv (CPU machines)
else PY=python3; fi                                     # the GPU image's torch interpreter
if [ -d .whl ] && ! "$PY" -c "import ray, av, draccus" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py "$@"
