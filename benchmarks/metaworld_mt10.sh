#!/usr/bin/env bash
# Issue 44: Meta-World MT10 on LeRobot's protocol, end to end on 2 CPUs, every step a command.
#   1. demos: the scripted experts, 50 successful episodes per task in lerobot/metaworld_mt50's
#      layout (`--layout lerobot`: PNG frames, unclipped actions, LeRobot's task ids) at 128 px;
#   2. flow_vla (tiny, about 3M parameters, fresh init) on 2 CPU workers: Muon at LR 3e-3 for
#      every group, cosine decay over STEPS x 64 samples, full shuffle, +-4 px shift augmentation;
#   3. DAgger, DAGGER_ROUNDS rounds (none when DAGGER_EPISODES=0): in round r the last policy
#      drives DAGGER_EPISODES episodes a task (reset seeds 2000 + (r-1) x DAGGER_EPISODES + k,
#      apart from the demos', the eval's and the other rounds'), the expert labels every state it
#      reaches, those episodes join everything collected before in one dataset
#      ($OUT/data_dagger<r>, `data metaworld --base --policy`), and a run continues from the last
#      policy's weights for DAGGER_STEPS (the training budget is STEPS + rounds x DAGGER_STEPS);
#      each policy episode is cut after DAGGER_MAX_STEPS steps (its frames are the cost);
#   4. `eval --env metaworld` of the last export: 10 episodes per task as lerobot-eval runs them
#      (reset seeds 1000 + k, 500-step limit, LeRobot's frames), replanning every N_ACTION_STEPS
#      of its 8-action chunk.
# Prints the MT10 average last. Outputs: $OUT/data, $OUT/flow_vla (run, metrics, export),
# $OUT/eval_<policy>/scores.json and rollouts/*.mp4, named after the policy scored, so that a rerun
# with more rounds scores the new policy beside the old one's eval (with DAgger also $OUT/data_dagger<r> and
# $OUT/flow_vla_dagger<r> for each round r, and the eval is of the last round's policy).
#
#   benchmarks/metaworld_mt10.sh [OUT]
# Environment: STEPS (default 4000), N_ACTION_STEPS (default 2), EPISODES_PER_TASK (50),
# DAGGER_EPISODES (default 20; 0: no DAgger), DAGGER_STEPS (default 10000), DAGGER_ROUNDS
# (default 1), DAGGER_MAX_STEPS (default 500, the step limit), ACTION_CLIP (LOW,HIGH: train on
# clipped actions; default empty, as stored), PY (the interpreter, default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/metaworld_mt10}
STEPS=${STEPS:-4000}
N_ACTION_STEPS=${N_ACTION_STEPS:-2}
EPISODES_PER_TASK=${EPISODES_PER_TASK:-50}
DAGGER_EPISODES=${DAGGER_EPISODES:-20}
DAGGER_STEPS=${DAGGER_STEPS:-10000}
DAGGER_ROUNDS=${DAGGER_ROUNDS:-1}
DAGGER_MAX_STEPS=${DAGGER_MAX_STEPS:-500}
PY=${PY:-.venv/bin/python}
for name in STEPS N_ACTION_STEPS EPISODES_PER_TASK DAGGER_STEPS DAGGER_ROUNDS DAGGER_MAX_STEPS; do
  [[ ${!name} =~ ^[1-9][0-9]*$ ]] || {
    echo "metaworld_mt10.sh: bad $name=${!name}, expected a positive integer" >&2
    exit 2
  }
done
[[ $DAGGER_EPISODES =~ ^[0-9]+$ ]] || {
  echo "metaworld_mt10.sh: bad DAGGER_EPISODES=$DAGGER_EPISODES, expected an integer >= 0" >&2
  exit 2
}
export RAYTRAIN_VLA_PROGRESS=${RAYTRAIN_VLA_PROGRESS:-1}
. benchmarks/metaworld_recipe.sh  # train(): the recipe, the same for every round (checks ACTION_CLIP)

[ -f "$OUT/data/meta/info.json" ] ||
  $PY -m raytrain_vla.data_cli metaworld "$OUT/data" --tasks mt10 \
    --episodes-per-task "$EPISODES_PER_TASK" --image-size 128 --layout lerobot --seed 0

# Each stage whose output exists is kept (rerun with another OUT to start over).
[ -d "$OUT/flow_vla/export" ] || train flow_vla "$OUT/data" "$STEPS"
POLICY=flow_vla
DATA=data
if [ "$DAGGER_EPISODES" -gt 0 ]; then
  for ROUND in $(seq 1 "$DAGGER_ROUNDS"); do
    [ -f "$OUT/data_dagger$ROUND/meta/info.json" ] ||
      $PY -m raytrain_vla.data_cli metaworld "$OUT/data_dagger$ROUND" --tasks mt10 \
        --episodes-per-task "$DAGGER_EPISODES" --base "$OUT/$DATA" \
        --policy "$OUT/$POLICY/export" --n-action-steps "$N_ACTION_STEPS" \
        --policy-max-steps "$DAGGER_MAX_STEPS" \
        --seed $((2000 + (ROUND - 1) * DAGGER_EPISODES))
    [ -d "$OUT/flow_vla_dagger$ROUND/export" ] ||
      train "flow_vla_dagger$ROUND" "$OUT/data_dagger$ROUND" "$DAGGER_STEPS" \
        --model.init_from="$OUT/$POLICY/export"
    DATA=data_dagger$ROUND
    POLICY=flow_vla_dagger$ROUND
  done
fi

$PY -m raytrain_vla.eval "$OUT/$POLICY/export" --env metaworld --tasks mt10 --episodes 10 \
  --seed 1000 --n-action-steps "$N_ACTION_STEPS" --workers 2 --out "$OUT/eval_$POLICY"

$PY -c "import json, sys; s = json.load(open(sys.argv[1]))
for name in ('policy', 'random', 'expert'):
    if name in s: print(f'MT10 {name}: {s[name][\"success_rate\"]:.2f}', s[name]['per_task'])" \
  "$OUT/eval_$POLICY/scores.json"
