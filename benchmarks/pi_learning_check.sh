#!/usr/bin/env bash
# Issue 28's learning check: pi0 or pi0.5 at the tiny fixture's dimensions (Gemma 64/48 wide,
# 3 layers, SigLIP 32 wide with 2 layers, 8x8 patches at 32 x 32, the fixture's 512-piece
# tokenizer), fresh weights, trained end to end on Ray (2 CPU workers, FSDP2 over the joint
# layers) with the default run's budget (3000 steps x 64) on the default demo data, then scored
# closed loop. Prints the run's summary JSON line.
#
#   benchmarks/pi_learning_check.sh pi05 [FIXTURES_DIR] [extra --key=value ...]
#
# The recipe that works for SmolVLA from scratch (benchmarks/smolvla_learning_check.sh): a
# constant LR after the default warm-up, a full shuffle, chunks of 10, every part training; and
# Muon at LR 3e-3 for every group (issue 44): with AdamW neither our pi nor LeRobot's own learns
# at this size in this budget (benchmarks/pi_lerobot_side_by_side.py, benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PI=${1:-pi05}
shift || true
FX=${1:-../shared/fixtures}
shift || true
exec .venv/bin/python -m raytrain_vla.run \
  --ray.run_name="${PI}_learning_check" --ray.resume=never --model.type="$PI" \
  --model.$PI.tokenizer_path="$FX/lerobot_${PI}_tiny/tokenizer" \
  --model.$PI.vlm_width=64 --model.$PI.vlm_mlp_dim=128 --model.$PI.expert_width=48 \
  --model.$PI.expert_mlp_dim=96 --model.$PI.depth=3 --model.$PI.head_dim=16 \
  --model.$PI.vision_width=32 --model.$PI.vision_layers=2 --model.$PI.vision_heads=2 \
  --model.$PI.vision_mlp_dim=64 --model.$PI.patch_size=8 --model.$PI.vocab_size=512 \
  --model.$PI.image_resolution=[32,32] --model.$PI.tokenizer_max_length=64 \
  --model.$PI.num_inference_steps=4 --data.chunk_size=10 \
  --scheduler.type=constant --data.shuffle_window=1000000 \
  --optimizer.type=muon --optimizer.groups=[] --optimizer.lr=3e-3 "$@"
