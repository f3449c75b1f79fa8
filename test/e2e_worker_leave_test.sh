#!/usr/bin/env bash
# A worker that leaves on purpose does not make the job wait for it. A sync
# job of 3 workers and 2 servers (grps-local), with a heartbeat timeout of
# 3 s:
#   - worker 2 gets SIGTERM (Kubernetes' scale-down): it finishes its step,
#     says so ("left the job after N of M steps") and exits 0;
#   - worker 1 is drained by `grpsctl drain 1`: the same;
#   - each time the global step stands still for far less than the heartbeat
#     timeout (the servers hear of the smaller live set at their next
#     heartbeat), and the figure is printed;
#   - grpsctl shows both ranks "left" and the live set; a worker started for
#     rank 1 joins the running job at the rank's step and finishes;
#   - grps-local exits 0; result.json counts 2 leaves and 1 join; every shard
#     ends at the job's step count (no step lost or applied twice).
set -euo pipefail
BIN=${1:?usage: e2e_worker_leave_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

HEARTBEAT_MS=100
TIMEOUT_MS=3000
STEPS=3000
run=$WORK/run
# Worker 0 paced at 3 ms a step: the job lasts 9 s at least, long enough for
# both leaves and the rejoin to land mid-run on a loaded machine.
start local "$BIN/grps-local" --run_dir="$run" --result_json="$run/result.json" \
  --mode=sync --servers=2 --workers=3 --steps=$STEPS --batch=32 --train_limit=6000 \
  --test_limit=1000 --hidden=64 --eval_every=0 --backend=cpu \
  --heartbeat_ms=$HEARTBEAT_MS --heartbeat_timeout_ms=$TIMEOUT_MS --timeout_s=200 \
  --straggler_rank=0 --straggle_ms=3
coordinator() { echo "127.0.0.1:$(cat "$run/coordinator.port")"; }
ctl() { GRPS_TOKEN=$(cat "$run/token") "$BIN/grpsctl" --coordinator="$(coordinator)" "$@"; }

# leave RANK HOW: makes worker RANK leave (sigterm or drain); checks that it
# exits 0 having said so, and that the job did not wait for a timeout. Sets
# LEFT_AT to the step it left after (from its log: no status read before
# the leave, each 0.4-1.5 s on a loaded machine, while the job runs on).
leave() {
  local rank=$1 how=$2 victim stall
  victim=$(child_pid "$PID_local" "grps-worker .*--rank=$rank ") || fail "no worker child of rank $rank"
  if [ "$how" = sigterm ]; then
    kill -TERM "$victim"
  else
    ctl drain "$rank" | grep -q "worker $rank drained" || fail "grpsctl drain $rank said otherwise"
  fi
  stall=$(measure_stall "$run" 1500)
  wait_worker_state "$run" "$rank" MEMBER_STATE_LEFT 5
  wait_for_line "$run/worker-$rank.log" "left the job after [0-9]* of $STEPS steps" 5
  LEFT_AT=$(sed -n "s/.*left the job after \([0-9]*\) of $STEPS steps.*/\1/p" "$run/worker-$rank.log")
  echo "worker $rank left by $how after step $LEFT_AT; the global step then stood still" \
       "for at most $stall ms (heartbeat interval $HEARTBEAT_MS ms, timeout $TIMEOUT_MS ms)"
  # A leave costs the servers' next heartbeat, not the heartbeat timeout; the
  # bound tells the two apart with room for a loaded machine and this
  # poller's own lag, and is not a performance goal.
  [ "$stall" -lt $((TIMEOUT_MS / 2)) ] || fail "the job waited $stall ms for worker $rank to leave"
  [ "$how" = sigterm ] || grep -q "drained by an operator" "$run/worker-$rank.log" \
    || fail "worker $rank did not say it was drained"
}

# The rejoin below must register, load its data and join before the job's
# last step: on a loaded machine it once joined 1.1 s before the end, the
# leaves having started past step 300 (a status read per sample) with four
# status reads more. Hence the first leave once the workers' logs say all
# three train (each loads its data first), and no status read not needed.
for rank in 0 1 2; do wait_for_line "$run/worker-$rank.log" "rank $rank trains " 90; done
sleep 0.3
leave 2 sigterm
wait_until_step "$run" $((LEFT_AT + 100)) 30
leave 1 drain
ctl status | grep -q "live set .*1 of 3 ranks live; 2 left" || fail "grpsctl status shows no live set"
ctl workers | grep -qE "^ +2 +left" || fail "grpsctl workers does not show rank 2 as left"

# A worker for rank 1 joins the running job at the rank's step.
GRPS_WORKER_TOKEN=$(cat "$run/worker_token") \
  start rejoin "$BIN/grps-worker" --coordinator="$(coordinator)" --rank=1 --backend=cpu
wait_pid "$PID_rejoin" 120
[ "$EXIT_CODE" = 0 ] || fail "the worker that rejoined rank 1 exited with $EXIT_CODE"
grep -q "re-registered rank 1" "$run/coordinator.log" || fail "the coordinator did not log the join"
left_at=$(sed -n 's/.*worker 1 left the job after step \([0-9]*\).*/\1/p' "$run/coordinator.log")
grep -q "start step $left_at)" "$run/coordinator.log" \
  || fail "rank 1 did not resume at the step it left at ($left_at)"
wait_pid "$PID_local" 120
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
python3 - "$run/result.json" <<'PY' || fail "result.json is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit"] == "ok", r
assert r["worker_leaves"] == 2 and r["worker_joins"] == 1, r
assert r.get("workers_died", 0) == 0, "nobody died: %s" % r
assert r["final_test_accuracy"] is not None and r["final_test_accuracy"] > 0.5, r
print("final accuracy %.4f; %d leaves, %d join" % (r["final_test_accuracy"], r["worker_leaves"],
                                                 r["worker_joins"]))
PY
grep -q "workers 1, 2 left before finishing\|worker 2 left before finishing" "$run/coordinator.log" \
  || fail "the coordinator's end message does not say who left"
versions=$(sed -n 's/.*shard [0-9]* exiting (job completed): version \([0-9]*\),.*/\1/p' \
  "$run"/server-*.log | sort -u | tr '\n' ' ')
[ "$versions" = "$STEPS " ] || fail "shards ended at versions $versions, not all $STEPS"
echo "PASS"
