#!/usr/bin/env bash
# A restarted coordinator gives its members a grace to reconnect before it
# declares anyone dead. A sync job (2 servers, 3 workers, heartbeat timeout
# 1 s) is started by hand; at step 200 the coordinator is killed (SIGKILL)
# and started again 3 s later on the same port with the same state folder.
# Then:
#   - it takes the job back and declares no member dead (before, all five
#     were declared dead 1 s after the take-over, before their channels
#     dialled it again, and the shards went on with different live sets);
#   - the job completes and every daemon exits 0;
#   - both shards end at the same version, the job's step count.
set -euo pipefail
BIN=${1:?usage: e2e_coordinator_restart_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

STEPS=1200
COORD=127.0.0.1:$(free_port)
coordinator() {  # NAME
  start "$1" "$BIN/grps-coordinator" --listen="$COORD" --mode=sync --servers=2 --workers=3 \
    --steps=$STEPS --batch=32 --train_limit=6000 --test_limit=500 --hidden=32 --eval_every=0 \
    --heartbeat_ms=100 --heartbeat_timeout_ms=1000 --checkpoint_dir="$WORK/ckpt"
}
coordinator coordinator
for s in 0 1; do start "server$s" "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0; done
for r in 0 1 2; do
  # Rank 0 sleeps 5 ms a step (it changes no value): the job lasts seconds
  # however fast the machine, so the restart lands mid-run.
  pace=()
  [ "$r" = 0 ] && pace=(--straggle_ms=5)
  start "worker$r" "$BIN/grps-worker" --coordinator="$COORD" --rank=$r --backend=cpu \
    --blas_threads=1 "${pace[@]}"
done
wait_until "$COORD" "int(j.get('global_step', 0)) >= 200" 120 "step 200"
kill -KILL "$PID_coordinator"
wait "$PID_coordinator" 2>/dev/null || true
echo "coordinator killed at step >= 200; restarting it in 3 s"
sleep 3
coordinator restarted
wait_until "$COORD" "j['state'] in ('JOB_STATE_RUNNING', 'JOB_STATE_COMPLETED')" 30 \
  "the restarted coordinator to take the job back"

for name in worker0 worker1 worker2 server0 server1 restarted; do
  pid_var=PID_$name
  wait_pid "${!pid_var}" 120
  [ "$EXIT_CODE" = 0 ] || fail "$name exited with $EXIT_CODE"
done
grep -q "took over job" "$WORK/restarted.log" || fail "the restarted coordinator did not take the job back"
if grep -E "missed its heartbeats" "$WORK/restarted.log"; then
  fail "the restarted coordinator declared members dead"
fi
versions=$(for s in 0 1; do sed -n 's/.*shard [0-9]* exiting (job completed): version \([0-9]*\),.*/\1/p' "$WORK/server$s.log"; done | tr '\n' ' ')
echo "shard versions at the end: $versions"
read -r v0 v1 <<<"$versions"
[ -n "$v0" ] && [ "$v0" = "$v1" ] || fail "the shards ended at different versions: $versions"
[ "$v0" = "$STEPS" ] || fail "the shards ended at version $v0, not $STEPS"
echo "PASS"
