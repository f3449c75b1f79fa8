#!/usr/bin/env bash
# A stopped job resumes from its checkpoint folder, with any number of servers.
#   1. A sync job with 2 servers checkpoints every 50 steps and is stopped
#      (grpsctl stop) once a checkpoint is complete: checkpoint C at step S.
#   2. A job with 3 servers and --steps=S starts on the same folder: it
#      resumes at step S, has nothing left to train, and its final checkpoint
#      holds chunks bit-identical to C's (the weights and optimizer state were
#      carried over exactly, through a different placement).
#   3. The same with 1 server, from the 3-server job's checkpoint: it resumes
#      at step S and its final checkpoint is bit-identical to C's again.
#   4. A job with 1 server and --steps=S+200 starts on the folder: it
#      resumes at step S (its coordinator says so) and completes.
set -euo pipefail
BIN=${1:?usage: e2e_restore_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

CKPT=$WORK/checkpoints
# The first job is long (it is stopped after its first checkpoint, well
# before the end, even on a slow machine); the last one trains 200 steps past
# the checkpoint.
FIRST_STEPS=20000
launch() {  # NAME SERVERS STEPS
  local run=$WORK/$1
  start "$1" "$BIN/grps-local" --run_dir="$run" --result_json="$run/result.json" \
    --mode=sync --servers="$2" --workers=2 --steps="$3" --batch=32 --train_limit=6000 \
    --test_limit=1000 --hidden=64 --eval_every=0 --backend=cpu --heartbeat_ms=100 \
    --heartbeat_timeout_ms=1000 --checkpoint_dir="$CKPT" --checkpoint_every_steps=50 \
    --timeout_s=200
}

# 1. Two servers, stopped after a checkpoint.
launch first 2 $FIRST_STEPS
for ((i = 0; i < 1200; i++)); do
  id=$(status "$WORK/first" | json 'j.get("last_checkpoint", {}).get("id", 0)' 2>/dev/null || echo 0)
  [ "${id:-0}" -gt 0 ] && break
  sleep 0.1
done
[ "${id:-0}" -gt 0 ] || fail "the first job completed no checkpoint"
# (On a loaded machine a checkpoint's fsync can stall until the job ends: a
# job that completed meanwhile is as good, its final checkpoint is C.)
GRPS_TOKEN=$(cat "$WORK/first/token") \
  "$BIN/grpsctl" --coordinator=127.0.0.1:"$(cat "$WORK/first/coordinator.port")" stop \
  >/dev/null 2>"$WORK/stop.err" || grep -q "already completed" "$WORK/stop.err" \
  || fail "grpsctl stop: $(cat "$WORK/stop.err")"
wait_pid "$PID_first" 60
[ "$EXIT_CODE" != timeout ] || fail "the stopped job did not end"
newest=$("$BIN/grps-checkpoint-diff" --newest "$CKPT")
step=$("$BIN/grps-checkpoint-diff" --step "$newest")
echo "stopped the 2-server job; newest complete checkpoint $(basename "$newest") at step $step"

# 2. Three servers, resumed at S with nothing left to train.
launch three 3 "$step"
wait_pid "$PID_three" 120
[ "$EXIT_CODE" = 0 ] || fail "the 3-server job exited with $EXIT_CODE"
grep -q "resum.*step $step" "$WORK/three/coordinator.log" \
  || fail "the 3-server job did not resume at step $step"
final=$("$BIN/grps-checkpoint-diff" --newest "$CKPT")
[ "$final" != "$newest" ] || fail "the 3-server job wrote no checkpoint"
"$BIN/grps-checkpoint-diff" "$newest" "$final" \
  || fail "the weights restored into 3 servers differ from the checkpoint"
echo "3 servers: resumed at step $step; its checkpoint $(basename "$final") is bit-identical"

# 3. One server, from the 3-server checkpoint, nothing left to train.
launch single 1 "$step"
wait_pid "$PID_single" 120
[ "$EXIT_CODE" = 0 ] || fail "the 1-server job at step $step exited with $EXIT_CODE"
grep -q "resum.*step $step" "$WORK/single/coordinator.log" \
  || fail "the 1-server job did not resume at step $step"
from_three=$final
final=$("$BIN/grps-checkpoint-diff" --newest "$CKPT")
[ "$final" != "$from_three" ] || fail "the 1-server job wrote no checkpoint"
"$BIN/grps-checkpoint-diff" "$newest" "$final" \
  || fail "the weights restored from 3 servers into 1 differ from the checkpoint"
echo "3 -> 1 server: resumed at step $step; its checkpoint $(basename "$final") is bit-identical"

# 4. One server, resumed and trained to the end.
launch one 1 $((step + 200))
wait_pid "$PID_one" 200
[ "$EXIT_CODE" = 0 ] || fail "the 1-server job exited with $EXIT_CODE"
grep -q "resum.*step $step" "$WORK/one/coordinator.log" \
  || fail "the 1-server job did not resume at step $step"
echo "1 server: resumed at step $step and completed, final accuracy" \
  "$(json 'j["final_test_accuracy"]' <"$WORK/one/result.json")"
echo "PASS"
