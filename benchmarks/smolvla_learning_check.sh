#!/usr/bin/env bash
# Issue 13's learning check: SmolVLA at the fixture's tiny SmolVLM config, fresh init, trained
# end to end on Ray (2 CPU workers, FSDP2) with the default run's budget (3000 steps x 64
# samples) on the demo task, then scored closed loop. Prints the run's summary JSON line.
#
#   benchmarks/smolvla_learning_check.sh [FIXTURES_DIR] [extra --key=value ...]
#
# The demo data has 6000 episodes here, not the default 1500: a ViT learned from scratch on
# 1500 scenes memorises them (train/held-out ratio about 0.4/0.7 at step 3000, in the plain
# loop and on Ray), while the CoordConv flow_vla generalises from 1500. The budget is the same.
set -euo pipefail
cd "$(dirname "$0")/.."
FX=${1:-../shared/fixtures}
shift || true
exec .venv/bin/python -m raytrain_vla.run \
  --ray.run_name=smolvla_learning_check --ray.resume=never \
  --data.root="${DEMO_6000_ROOT:-$HOME/.cache/raytrain_vla/demo_6000}" --data.demo_episodes=6000 \
  --model.type=smolvla --model.smolvla.vlm_path="$FX/lerobot_smolvla_tiny/vlm" \
  --model.smolvla.num_vlm_layers=4 --model.smolvla.resize_imgs_with_padding=[32,32] \
  --model.smolvla.num_steps=4 --model.smolvla.train_expert_only=false \
  --model.smolvla.freeze_vision_encoder=false --data.chunk_size=10 "$@"
