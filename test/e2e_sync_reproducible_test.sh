#!/usr/bin/env bash
# A sync job is bit-reproducible with any number of workers: the same job
# (3 workers, 2 servers, a final checkpoint) run twice ends in checkpoints
# whose values, optimizer state and versions are bit-identical
# (grps-checkpoint-diff). Each step's sum is added up in rank order
# (server/sync_policy.cc); in arrival order, with three workers or more, two
# runs differed.
set -euo pipefail
BIN=${1:?usage: e2e_sync_reproducible_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

for run in a b; do
  start "$run" "$BIN/grps-local" --run_dir="$WORK/$run" --result_json="$WORK/$run/result.json" \
    --mode=sync --servers=2 --workers=3 --steps=400 --batch=32 --train_limit=12000 \
    --test_limit=1000 --eval_every=0 --backend=cpu --checkpoint_dir="$WORK/$run/ckpt" \
    --timeout_s=200
  pid_var=PID_$run
  wait_pid "${!pid_var}" 220
  [ "$EXIT_CODE" = 0 ] || fail "run $run: grps-local exited with $EXIT_CODE"
done
a=$("$BIN/grps-checkpoint-diff" --newest "$WORK/a/ckpt") || fail "run a wrote no checkpoint"
b=$("$BIN/grps-checkpoint-diff" --newest "$WORK/b/ckpt") || fail "run b wrote no checkpoint"
[ "$("$BIN/grps-checkpoint-diff" --step "$a")" = 400 ] || fail "run a's final checkpoint is not at step 400"
"$BIN/grps-checkpoint-diff" "$a" "$b" || fail "two runs of the same 3-worker sync job differ"
echo "PASS"
