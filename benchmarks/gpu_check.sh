#!/usr/bin/env bash
# GPU check (issue 7): nccl FSDP2 gradients, then base-model bf16 throughput, MFU, peak memory
# and data-wait share through raytrain_vla on Ray against a plain torch loop; then (issue 29)
# the background checkpoint's stall ratio on the GPU. JSON to $OUT.
#
#   bash benchmarks/gpu_check.sh            # on one H200, under 8 minutes
#   bash benchmarks/gpu_check.sh --dry-run  # on CPU: tiny model, a few steps (tests run this)
#
# The GPU machine has torch but not Ray, PyAV or draccus and cannot reach a package index:
# `bash benchmarks/fetch_gpu_wheels.sh` downloads them here into .whl/a and .whl/b (git-ignored,
# each under one call's 64 MiB), carried by two calls in a row. Without wheels the current
# interpreter is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python  # this project's venv (CPU machines)
else PY=python3; fi                                     # the GPU image's torch interpreter
# Carried wheels (.whl/a with `--stage` in a first call, .whl/b in the second: see
# fetch_gpu_wheels.sh) install into /tmp/site, which the warm machine keeps between calls.
SITE=/tmp/site
shopt -s nullglob
wheels=(.whl/*.whl .whl/*/*.whl)
has_deps() { "$PY" -c "import ray, av, draccus" 2>/dev/null; }
if ! has_deps; then  # the GPU image: use (and fill) the carried site
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  if [ ${#wheels[@]} -gt 0 ] && ! has_deps; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${wheels[@]}"
  fi
fi
if [ "${1:-}" = "--stage" ]; then
  echo "staged: $("$PY" -c 'import av, draccus; print("av", av.__version__, "draccus ok")')"; exit 0
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" benchmarks/gpu_check.py "$@"
case " $* " in
  *" --dry-run "*) ;;  # on CPU the stall is checkpoint_stall.py's own run (benchmarks/README)
  *)  # issue 29: a background save's stall with the step loop on the GPU, the host CPUs idle;
      # 240M parameters (2.9 GB with AdamW state; /dev/shm must hold it), so a save takes seconds
    "$PY" benchmarks/checkpoint_stall.py --device cuda --workers 1 --d-model 1024 --layers 8 \
      --repeats 3 | tee "${OUT:-.}/checkpoint_stall.json" ;;
esac
