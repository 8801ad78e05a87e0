#!/usr/bin/env bash
# Issue 44: Meta-World MT10 on LeRobot's protocol, end to end on 2 CPUs, every step a command.
#   1. demos: the scripted experts, 50 successful episodes per task in lerobot/metaworld_mt50's
#      layout (`--layout lerobot`: PNG frames, unclipped actions, LeRobot's task ids) at 128 px;
#   2. flow_vla (tiny, about 3M parameters, fresh init) on 2 CPU workers: Muon at LR 3e-3 for
#      every group, cosine decay over STEPS x 64 samples, full shuffle, +-4 px shift augmentation;
#   3. `eval --env metaworld` of its export: 10 episodes per task as lerobot-eval runs them
#      (reset seeds 1000 + k, 500-step limit, LeRobot's frames), replanning every N_ACTION_STEPS
#      of its 8-action chunk, next to random actions and the scripted expert.
# Prints the MT10 average last. Outputs: $OUT/data, $OUT/flow_vla (run, metrics, export),
# $OUT/eval_flow_vla/scores.json and rollouts/*.mp4.
#
#   benchmarks/metaworld_mt10.sh [OUT]
# Environment: STEPS (default 5000), N_ACTION_STEPS (default 2), EPISODES_PER_TASK (50).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/metaworld_mt10}
STEPS=${STEPS:-5000}
N_ACTION_STEPS=${N_ACTION_STEPS:-2}
EPISODES_PER_TASK=${EPISODES_PER_TASK:-50}
PY=.venv/bin/python
export RAYTRAIN_VLA_PROGRESS=${RAYTRAIN_VLA_PROGRESS:-1}

[ -f "$OUT/data/meta/info.json" ] ||
  $PY -m raytrain_vla.data_cli metaworld "$OUT/data" --tasks mt10 \
    --episodes-per-task "$EPISODES_PER_TASK" --image-size 128 --layout lerobot --seed 0

$PY -m raytrain_vla.run --data.root="$OUT/data" --ray.storage_path="$OUT" --ray.resume=never \
  --ray.run_name=flow_vla --train.steps="$STEPS" --train.global_batch_size=64 \
  --train.micro_batch_size=32 --train.val_interval=1000 --train.save_interval=1000 \
  --train.log_interval=50 --train.reshard_after_forward=false \
  --optimizer.type=muon --optimizer.groups=[] --optimizer.lr=3e-3 --scheduler.type=cosine \
  --data.shuffle_window=1000000 --data.augment.max_shift_px=4 \
  --logging.wandb_mode=disabled --eval.episodes=0

$PY -m raytrain_vla.eval "$OUT/flow_vla/export" --env metaworld --tasks mt10 --episodes 10 \
  --seed 1000 --n-action-steps "$N_ACTION_STEPS" --workers 2 --out "$OUT/eval_flow_vla"

$PY -c "import json, sys; s = json.load(open(sys.argv[1]))
for name in ('policy', 'random', 'expert'):
    if name in s: print(f'MT10 {name}: {s[name][\"success_rate\"]:.2f}', s[name]['per_task'])" \
  "$OUT/eval_flow_vla/scores.json"
