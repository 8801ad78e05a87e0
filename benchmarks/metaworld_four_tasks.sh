#!/usr/bin/env bash
# Issue 44: what lifts the four MT10 tasks flow_vla keeps failing (reach, push, pick-place,
# peg-insert-side: their goal marker and puck are 2-3 px at 128)? Arms side by side, from one set
# of demos:
#   1. demos: the scripted experts, EPISODES_PER_TASK successful episodes of each of TASKS in
#      lerobot/metaworld_mt50's layout at 256 px (the render costs about the same at 128);
#   2. the MT10 recipe (benchmarks/metaworld_recipe.sh) for STEPS, once per arm of ARMS:
#        at128: frames resized to 128 (`data.image_size`), the tiny preset's 3-conv stem, 16 x 16
#               tokens, +-4 px shifts;
#        at256: frames at 256, one more stride-2 conv (`model.flow_vla.vision_strides=[2,2,2,2]`),
#               the same 16 x 16 tokens, +-8 px shifts (the same fraction of the frame);
#        kp32:  at128 plus 32 spatial-softmax keypoint tokens (`model.flow_vla.keypoints=32`):
#               where a feature is, finer than the grid's 8 x 8 px cells;
#        kp32w: kp32 with a stem twice as wide (`model.flow_vla.vision_channels=[64,64,64]`);
#        kp32s4w128: 32 keypoints over an 8 x 8 grid (a fourth stride-2 conv, widths 32, 32, 64,
#               64) and transformers twice as wide (`model.flow_vla.width=128`): 3.7x the
#               parameters at kp32's cost per sample;
#   3. `eval --env metaworld` of each: 10 episodes a task as lerobot-eval runs them (reset seeds
#      1000 + k, 500 steps), replanning every N_ACTION_STEPS; all render at 256 and the
#      policies' processors resize, as in training.
# Prints one JSON line: each arm's success (average and per task), training wall time,
# samples/s and final val_mse_ratio. Stages whose output exists are kept, so arms run in
# separate invocations still share the demos.
#
#   benchmarks/metaworld_four_tasks.sh [OUT]
# Environment: ARMS (default "at128 at256"), STEPS (default 2000), TASKS (default
# reach,push,pick-place,peg-insert-side), EPISODES_PER_TASK (50), N_ACTION_STEPS (2),
# ACTION_CLIP (LOW,HIGH: every arm trains on clipped actions; default empty), PY (default
# .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/metaworld_four_tasks}
ARMS=${ARMS-at128 at256}  # set but empty is refused below, not replaced
STEPS=${STEPS:-2000}
TASKS=${TASKS:-reach,push,pick-place,peg-insert-side}
EPISODES_PER_TASK=${EPISODES_PER_TASK:-50}
N_ACTION_STEPS=${N_ACTION_STEPS:-2}
PY=${PY:-.venv/bin/python}
for name in STEPS EPISODES_PER_TASK N_ACTION_STEPS; do
  [[ ${!name} =~ ^[1-9][0-9]*$ ]] || {
    echo "metaworld_four_tasks.sh: bad $name=${!name}, expected a positive integer" >&2
    exit 2
  }
done
declare -A ARM_ARGS=(
  [at128]="--data.image_size=[128,128] --data.augment.max_shift_px=4"
  [at256]="--model.flow_vla.vision_strides=[2,2,2,2] --data.augment.max_shift_px=8"
  [kp32]="--data.image_size=[128,128] --data.augment.max_shift_px=4 --model.flow_vla.keypoints=32"
  [kp32s4w128]="--data.image_size=[128,128] --data.augment.max_shift_px=4 --model.flow_vla.keypoints=32 --model.flow_vla.vision_strides=[2,2,2,2] --model.flow_vla.vision_channels=[32,32,64,64] --model.flow_vla.width=128"
  [kp32w]="--data.image_size=[128,128] --data.augment.max_shift_px=4 --model.flow_vla.keypoints=32 --model.flow_vla.vision_channels=[64,64,64]"
)
read -ra ARM_LIST <<<"$ARMS"
[ ${#ARM_LIST[@]} -gt 0 ] || {
  echo "metaworld_four_tasks.sh: bad ARMS='$ARMS', expected arm names from: ${!ARM_ARGS[*]}" >&2
  exit 2
}
for arm in "${ARM_LIST[@]}"; do
  [ -n "${ARM_ARGS[$arm]:-}" ] || {
    echo "metaworld_four_tasks.sh: bad ARMS='$ARMS': unknown arm '$arm', known: ${!ARM_ARGS[*]}" >&2
    exit 2
  }
done
export RAYTRAIN_VLA_PROGRESS=${RAYTRAIN_VLA_PROGRESS:-1}
. benchmarks/metaworld_recipe.sh

[ -f "$OUT/data/meta/info.json" ] ||
  $PY -m raytrain_vla.data_cli metaworld "$OUT/data" --tasks "$TASKS" \
    --episodes-per-task "$EPISODES_PER_TASK" --image-size 256 --layout lerobot --seed 0

for arm in "${ARM_LIST[@]}"; do
  # shellcheck disable=SC2086  # the arm's overrides are words
  [ -d "$OUT/$arm/export" ] ||
    train "$arm" "$OUT/data" "$STEPS" ${ARM_ARGS[$arm]} | tee "$OUT/$arm.log"
  [ -f "$OUT/eval_$arm/scores.json" ] ||
    $PY -m raytrain_vla.eval "$OUT/$arm/export" --env metaworld --tasks "$TASKS" \
      --episodes 10 --seed 1000 --n-action-steps "$N_ACTION_STEPS" --workers 2 \
      --no-baselines --out "$OUT/eval_$arm"
done

$PY -c "import json, sys
out = sys.argv[1]
report = {}
for arm in sys.argv[2:]:
    summary = {}
    for line in open(f'{out}/{arm}.log'):
        if line.startswith('summary: '):
            summary = json.loads(line[len('summary: '):])
    policy = json.load(open(f'{out}/eval_{arm}/scores.json'))['policy']
    report[arm] = {'success_rate': round(policy['success_rate'], 3), 'per_task': policy['per_task'],
                   'train_wall_s': summary.get('wall_s'), 'samples_per_s': summary.get('samples_per_s'),
                   'val_mse_ratio': summary.get('val_mse_ratio')}
print(json.dumps(report))" "$OUT" "${ARM_LIST[@]}"
