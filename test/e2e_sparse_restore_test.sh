#!/usr/bin/env bash
# Sparse tables are in checkpoints (issue 11): the embedding model's rows,
# with their AdaGrad state and update counts, survive a server killed with
# SIGKILL and a restart into another number of servers, exactly.
#   1. Sync, synthetic sparse data, 2 servers, a checkpoint every 100 steps,
#      undisturbed: final accuracy A, final checkpoint F.
#   2. The same job with incremental checkpoints (--checkpoint_full_every=20:
#      each shard's file of the checkpoints after a full one holds only the
#      rows changed since its previous one; a restore starts a full one),
#      each shard's rows in part files of 64 KiB (--checkpoint_part_kib=64,
#      as a shard of more than a gigabyte writes them), and
#      server 1 killed after an incremental checkpoint: grps-local restarts
#      it, it reloads its rows (as a rule from the full file and the
#      increments), the job rolls back to the checkpoint and completes with
#      accuracy A exactly and a final checkpoint bit-identical to F (every
#      chunk and every row).
#   3. A job of 3 servers with --steps at F's step, on the disturbed run's
#      folder (its newest checkpoint mostly incremental): it resumes there with
#      nothing left to train, and its final checkpoint (rows rehashed from 2
#      chains of files into 3; its own in parts too) is bit-identical to F.
#   4. The same into 1 server from the 3-server job's checkpoint.
set -euo pipefail
BIN=${1:?usage: e2e_sparse_restore_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"

STEPS=800
# The worker of rank 0 sleeps 6 ms after every step (it changes no value):
# the job lasts seconds whatever the machine's speed, so the kill lands
# mid-run.
PACE=(--straggler_rank=0 --straggle_ms=6)
MODEL=(--model=embedding --data_format=synthetic --classes=4 --optimizer=adagrad --lr=0.1
       --embedding_dim=16 --hidden=none --batch=32)

launch() {  # NAME SERVERS STEPS CHECKPOINT_DIR [flags...]
  local name=$1 servers=$2 steps=$3 ckpt=$4; shift 4
  local run=$WORK/$name
  start "$name" "$BIN/grps-local" --run_dir="$run" --result_json="$run/result.json" \
    --mode=sync --servers="$servers" --workers=2 --steps="$steps" "${MODEL[@]}" \
    --eval_every=0 --backend=cpu --heartbeat_ms=100 --heartbeat_timeout_ms=1000 \
    --checkpoint_dir="$ckpt" --checkpoint_every_steps=100 --recovery_timeout_ms=20000 \
    --timeout_s=200 "$@"
}
accuracy() { json 'j["final_test_accuracy"]' <"$1/result.json"; }
newest() { "$BIN/grps-checkpoint-diff" --newest "$1"; }

# 1. Undisturbed.
launch calm 2 $STEPS "$WORK/calm-ckpt" "${PACE[@]}"
wait_pid "$PID_calm" 200
[ "$EXIT_CODE" = 0 ] || fail "undisturbed run: grps-local exited with $EXIT_CODE"
final=$(newest "$WORK/calm-ckpt")
step=$("$BIN/grps-checkpoint-diff" --step "$final")
[ "$step" = $STEPS ] || fail "the undisturbed run's newest checkpoint is at step $step, not $STEPS"
grep -q "sparse rows" "$WORK/calm/server-0.log" || fail "shard 0 wrote no sparse rows"

# 2. Incremental checkpoints, server 1 killed after one at step 200 or later
# (checkpoint 1, at step 100, is full, the next ones increments unless one
# fails).
PARTS=(--checkpoint_part_kib=64)
launch killed 2 $STEPS "$WORK/killed-ckpt" "${PACE[@]}" --checkpoint_full_every=20 "${PARTS[@]}"
# The victim first; then the kill as soon as a streamed snapshot shows a
# complete checkpoint at step 200 or later passed (a status read a sample
# took up to 1.5 s on a loaded machine).
wait_for_file "$WORK/killed/coordinator.port" 30
victim=
for ((i = 0; i < 300; i++)); do
  victim=$(child_pid "$PID_killed" "grps-server .*--shard=1") && break
  sleep 0.1
done
[ -n "$victim" ] || fail "no grps-server child"
snapshot=$(watch_run_until "$WORK/killed" "j.get('last_checkpoint', {}).get('state') == 'CHECKPOINT_STATE_COMPLETE' and int(j['last_checkpoint'].get('step', 0)) >= 200 and int(j.get('global_step', 0)) > int(j['last_checkpoint']['step'])" 120) ||
  fail "the job completed no checkpoint at step 200 or later"
kill -KILL "$victim"
at=$(json 'int(j["last_checkpoint"]["step"])' <<<"$snapshot")
global=$(json 'int(j.get("global_step", 0))' <<<"$snapshot")
echo "killed server 1 (pid $victim) at step $global, after the checkpoint at step $at"
grep -q "incremental on checkpoint" "$WORK/killed/server-1.log" \
  || fail "shard 1 wrote no incremental checkpoint before the kill"
[ "$global" -lt $((STEPS - 100)) ] || fail "the kill came too late (step $global of $STEPS)"
wait_pid "$PID_killed" 200
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE after the kill"
grep -q "shard 1 restored .* sparse rows from checkpoint" "$WORK/killed/server-1.restart-1.log" \
  || fail "the restarted shard did not reload its rows"
parts=$(ls "$WORK"/killed-ckpt/ckpt-*/shard-0000[01].part-* | wc -l)
[ "$parts" -gt 2 ] || fail "the shards wrote $parts part files of 64 KiB"
echo "$parts part files of 64 KiB"
calm=$(accuracy "$WORK/calm"); killed=$(accuracy "$WORK/killed")
echo "final accuracy $killed with the kill, $calm undisturbed"
[ "$calm" = "$killed" ] || fail "accuracy $killed differs from the undisturbed $calm"
"$BIN/grps-checkpoint-diff" "$final" "$(newest "$WORK/killed-ckpt")" \
  || fail "the final rows differ from the undisturbed run's"

# 3. Three servers, resumed at the final step with nothing left to train,
# from the disturbed run's newest checkpoint.
incremental=$(newest "$WORK/killed-ckpt")
id=$((10#${incremental##*ckpt-}))
# An increment unless the checkpoint before it failed (a sync cut a shard had
# passed on a loaded machine): said, not checked.
if grep -q "checkpoint $id: shard 0 wrote .*(incremental on checkpoint" \
     "$WORK/killed/server-0.log"; then
  echo "the disturbed run's final checkpoint $id is incremental"
else
  echo "the disturbed run's final checkpoint $id is a full one"
fi
launch three 3 "$step" "$WORK/killed-ckpt" "${PARTS[@]}"
wait_pid "$PID_three" 120
[ "$EXIT_CODE" = 0 ] || fail "the 3-server job exited with $EXIT_CODE"
grep -q "resum.*step $step" "$WORK/three/coordinator.log" \
  || fail "the 3-server job did not resume at step $step"
from_three=$(newest "$WORK/killed-ckpt")
[ "$from_three" != "$incremental" ] || fail "the 3-server job wrote no checkpoint"
"$BIN/grps-checkpoint-diff" "$final" "$from_three" \
  || fail "the rows restored into 3 servers differ from the checkpoint"

# 4. One server, from the 3-server checkpoint.
launch single 1 "$step" "$WORK/killed-ckpt"
wait_pid "$PID_single" 120
[ "$EXIT_CODE" = 0 ] || fail "the 1-server job exited with $EXIT_CODE"
from_one=$(newest "$WORK/killed-ckpt")
[ "$from_one" != "$from_three" ] || fail "the 1-server job wrote no checkpoint"
"$BIN/grps-checkpoint-diff" "$final" "$from_one" \
  || fail "the rows restored from 3 servers into 1 differ from the checkpoint"
echo "PASS"
