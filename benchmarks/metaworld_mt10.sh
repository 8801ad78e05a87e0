#!/usr/bin/env bash
# Issue 30: Meta-World MT10 end to end on 2 CPUs, every step a documented command.
#   1. demos: the scripted experts, 25 successful episodes per task at 64x64 (~13 min);
#   2. flow_vla (tiny, ~3M parameters, fresh init) on 2 CPU workers: 6000 steps x 64 samples,
#      constant LR, full shuffle (~22 min);
#   3. `eval --env metaworld` of its export: 10 episodes per task, LeRobot's protocol (500 steps,
#      seeds 1000 + k),
#      next to random actions and the scripted expert (~15-25 min, most of it rendering);
#   4. SmolVLA at the fixture's tiny SmolVLM config with the recipe that works for it on the
#      demo task (constant LR, full shuffle, 32x32 inputs; benchmarks/smolvla_learning_check.sh),
#      3000 steps, then the same evaluation without the baselines.
# The whole script fits a 180-minute working session with room to spare on 2 cores. Outputs:
# $OUT/eval_flow_vla/scores.json, $OUT/eval_smolvla/scores.json (and rollouts/*.mp4 in each).
#
#   benchmarks/metaworld_mt10.sh [OUT] [FIXTURES_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/metaworld_mt10}
FX=${2:-../shared/fixtures}
PY=.venv/bin/python
export RAYTRAIN_VLA_PROGRESS=${RAYTRAIN_VLA_PROGRESS:-1}
COMMON=(
  --data.root="$OUT/data" --ray.storage_path="$OUT" --ray.resume=never
  --train.global_batch_size=64 --train.micro_batch_size=32 --train.val_interval=1000
  --train.save_interval=1000 --train.log_interval=50 --scheduler.type=constant
  --data.shuffle_window=1000000 --logging.wandb_mode=disabled --eval.episodes=0
)
EVAL=(--env metaworld --tasks mt10 --episodes 10 --seed 1000 --workers 2)

[ -f "$OUT/data/meta/info.json" ] ||
  $PY -m raytrain_vla.data_cli metaworld "$OUT/data" --tasks mt10 --episodes-per-task 25 \
    --image-size 64 --seed 0

$PY -m raytrain_vla.run "${COMMON[@]}" --ray.run_name=flow_vla --train.steps=6000 \
  --train.reshard_after_forward=false
$PY -m raytrain_vla.eval "$OUT/flow_vla/export" "${EVAL[@]}" --out "$OUT/eval_flow_vla"

$PY -m raytrain_vla.run "${COMMON[@]}" --ray.run_name=smolvla --train.steps=3000 \
  --model.type=smolvla --model.smolvla.vlm_path="$FX/lerobot_smolvla_tiny/vlm" \
  --model.smolvla.num_vlm_layers=4 --model.smolvla.resize_imgs_with_padding=[32,32] \
  --model.smolvla.num_steps=4 --model.smolvla.train_expert_only=false \
  --model.smolvla.freeze_vision_encoder=false --data.chunk_size=10
$PY -m raytrain_vla.eval "$OUT/smolvla/export" "${EVAL[@]}" --no-baselines --out "$OUT/eval_smolvla"
