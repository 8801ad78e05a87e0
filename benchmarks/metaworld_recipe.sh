# The Meta-World training recipe of issue 44, sourced by benchmarks/metaworld_mt10.sh and
# benchmarks/metaworld_frame_size.sh so that both train exactly alike. Needs PY and OUT.
#   train RUN_NAME DATA STEPS [more overrides]
# flow_vla (tiny, fresh init unless an override says otherwise) on 2 CPU workers: Muon at LR 3e-3
# for every group, cosine decay over STEPS x 64 samples, full shuffle, +-4 px shift augmentation
# (a later --data.augment.max_shift_px wins). ACTION_CLIP=LOW,HIGH (e.g. -1,1, what the env
# executes) trains on clipped actions (`data.action_clip`); unset or empty: actions as stored.
ACTION_CLIP=${ACTION_CLIP:-}
[[ -z $ACTION_CLIP || $ACTION_CLIP =~ ^-?[0-9]+(\.[0-9]+)?,-?[0-9]+(\.[0-9]+)?$ ]] || {
  echo "$(basename "$0"): bad ACTION_CLIP=$ACTION_CLIP, expected LOW,HIGH (e.g. -1,1) or empty" >&2
  exit 2
}
train() {
  local name=$1 data=$2 steps=$3
  shift 3
  $PY -m raytrain_vla.run --data.root="$data" --ray.storage_path="$OUT" --ray.resume=never \
    --ray.run_name="$name" --train.steps="$steps" --train.global_batch_size=64 \
    --train.micro_batch_size=32 --train.val_interval=1000 --train.save_interval=1000 \
    --train.log_interval=50 --train.reshard_after_forward=false \
    --optimizer.type=muon --optimizer.groups=[] --optimizer.lr=3e-3 --scheduler.type=cosine \
    --data.shuffle_window=1000000 --data.augment.max_shift_px=4 \
    --logging.wandb_mode=disabled --eval.episodes=0 \
    ${ACTION_CLIP:+"--data.action_clip=[$ACTION_CLIP]"} "$@"
}
