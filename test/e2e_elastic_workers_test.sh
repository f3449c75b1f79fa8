#!/usr/bin/env bash
# An elastic sync job scales its workers 2 -> 4 -> 2 while it trains, and
# each epoch's examples are trained exactly once (issue 31, acceptance 1).
#   - The yardstick: the default job (Fashion-MNIST, the MLP, sync, 2
#     servers) for 4 epochs with exactly 2 workers.
#   - The same job elastic (--workers=2 --max_workers=4). At global step 300
#     two grps-worker processes start for ranks 2 and 3 and join (once their
#     data is loaded: a few hundred steps later); 100 steps after they join,
#     rank 3 is drained with `grpsctl drain` and rank 2 gets SIGTERM.
# Checks: grps-local exits 0; the result counts 2 joins and 2 leaves; the
# coordinator's example ledger trained every block, none refused; the
# workers' own examples logs show every example of every epoch trained
# exactly once; the final accuracy is within 0.01 of the yardstick's; the
# global step never stood still for anywhere near the heartbeat timeout (the
# figures are printed); every shard ends at the same version. Then a 2-epoch
# elastic job whose coordinator is killed (SIGKILL) at step 300 and started
# again: its ledger and the workers' logs still show each example of each
# epoch trained exactly once.
set -euo pipefail
BIN=${1:?usage: e2e_elastic_workers_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
PYTHON=/usr/bin/python3

EPOCHS=4
HEARTBEAT_MS=100
TIMEOUT_MS=3000
common=(--mode=sync --servers=2 --workers=2 --epochs=$EPOCHS --backend=cpu --eval_every=0
        --heartbeat_ms=$HEARTBEAT_MS --heartbeat_timeout_ms=$TIMEOUT_MS --timeout_s=300)

fixed=$WORK/fixed
start fixed "$BIN/grps-local" --run_dir="$fixed" --result_json="$fixed/result.json" "${common[@]}"
wait_pid "$PID_fixed" 300
[ "$EXIT_CODE" = 0 ] || fail "the fixed-size job exited with $EXIT_CODE"

run=$WORK/run
# Worker 0 paced at 8 ms a step, so that the joins and the leaves land
# mid-run on a loaded machine: the joiners take 2-3 s there to load their
# data, and each status read of this script 0.4-1 s.
start local "$BIN/grps-local" --run_dir="$run" --result_json="$run/result.json" "${common[@]}" \
  --max_workers=4 --examples_logs --straggler_rank=0 --straggle_ms=8
coordinator() { echo "127.0.0.1:$(cat "$run/coordinator.port")"; }
ctl() { GRPS_TOKEN=$(cat "$run/token") "$BIN/grpsctl" --coordinator="$(coordinator)" "$@"; }

wait_until_step "$run" 300 120
for rank in 2 3; do
  GRPS_WORKER_TOKEN=$(cat "$run/worker_token") start "join$rank" "$BIN/grps-worker" \
    --coordinator="$(coordinator)" --rank=$rank --backend=cpu --blas_threads=1 \
    --examples_log="$run/examples-worker-$rank.log"
done
stall=$(measure_stall "$run" 2500)
echo "ranks 2 and 3 started at global step 300; the global step then stood still for at most" \
     "$stall ms (heartbeat interval $HEARTBEAT_MS ms)"
# They join the live set once their data is loaded (seconds under a
# sanitizer).
for rank in 2 3; do
  wait_for_line "$run/coordinator.log" "worker $rank is ready to train: it joins the live set" 120
done
ctl status | grep -q "live set .*4 of 4 ranks live; 0 left, 2 joined" \
  || fail "grpsctl status does not show 4 live ranks"

# The scale-down 100 steps after the later of the two joins (each worker
# logs the step it joined at). From a join at step J, four workers run out
# of the ledger's 3,748 blocks at about step J + (3748 - 2J) / 4: at least
# 2.5 s later at 8 ms a step for any J up to 1,000, time for the status
# reads below even on a loaded machine.
joined=0
for rank in 2 3; do
  wait_for_line "$WORK/join$rank.log" "joining the others at step" 30
  j=$(sed -n 's/.*joining the others at step \([0-9]*\).*/\1/p' "$WORK/join$rank.log" | head -1)
  [ "$j" -gt "$joined" ] && joined=$j
done
down=$((joined + 100))
wait_until_step "$run" $down 120
ctl drain 3 | grep -q "worker 3 drained" || fail "grpsctl drain 3 said otherwise"
kill -TERM "$PID_join2"
stall=$(measure_stall "$run" 1500)
echo "rank 3 drained and rank 2 sent SIGTERM at global step $down; the global step then stood" \
     "still for at most $stall ms (heartbeat interval $HEARTBEAT_MS ms, timeout $TIMEOUT_MS ms)"
[ "$stall" -lt $((TIMEOUT_MS / 2)) ] || fail "the job waited $stall ms for the leaving workers"
for rank in 2 3; do
  eval "pid=\$PID_join$rank"
  wait_pid "$pid" 60
  [ "$EXIT_CODE" = 0 ] || fail "the worker of rank $rank exited with $EXIT_CODE"
  grep -q "left the job after [0-9]* of an elastic job's steps" "$WORK/join$rank.log" \
    || fail "rank $rank did not say it left"
done

wait_pid "$PID_local" 200
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
"$PYTHON" - "$fixed/result.json" "$run/result.json" <<'PY' || fail "result.json is wrong"
import json, sys
fixed, r = (json.load(open(p)) for p in sys.argv[1:])
assert r["exit"] == "ok", r
assert r["worker_joins"] == 2 and r["worker_leaves"] == 2, r
assert r.get("workers_died", 0) == 0, "nobody died: %s" % r
d = r["data"]
assert d["total_blocks"] == 4 * d["blocks_per_epoch"], d
assert d["trained"] == d["total_blocks"] and d["leased"] == 0 and d["refused_reports"] == 0, d
gap = r["final_test_accuracy"] - fixed["final_test_accuracy"]
print("final accuracy %.4f elastic (2 -> 4 -> 2 workers), %.4f with 2 workers throughout "
      "(difference %+.4f); ledger: %d of %d blocks trained, %d came back and were leased again"
      % (r["final_test_accuracy"], fixed["final_test_accuracy"], gap, d["trained"],
         d["total_blocks"], d["returned"]))
assert abs(gap) <= 0.01, "accuracy differs from the fixed-size run's by %.4f" % gap
PY
# 937 blocks of 64 examples per epoch (60000 // 64).
"$PYTHON" "$(dirname "$0")/check_examples.py" $((60000 / 64 * 64)) $EPOCHS "$run"/examples-worker-*.log \
  || fail "the examples trained are not each epoch's, exactly once"
versions=$(sed -n 's/.*shard [0-9]* exiting (job completed): version \([0-9]*\),.*/\1/p' \
  "$run"/server-*.log | sort -u | wc -l)
[ "$versions" = 1 ] || fail "the shards ended at different versions"

# The coordinator killed (SIGKILL) mid-job and started again by grps-local:
# it takes the ledger back from its state file, which may miss the last
# leases and reports; the workers' re-sent reports and held blocks fill it
# in, and every example of each epoch is still trained exactly once.
killed=$WORK/killed
start killed "$BIN/grps-local" --run_dir="$killed" --result_json="$killed/result.json" \
  "${common[@]/--epochs=$EPOCHS/--epochs=2}" --max_workers=3 --examples_logs \
  --straggler_rank=0 --straggle_ms=3
# The status is streamed and the coordinator killed on the first snapshot
# at step 300 (the victim found beforehand): a status read per sample (each
# up to 1.5 s on a loaded machine) left the kill some 2.5 s before the
# job's end, 3 ms a step.
wait_for_file "$killed/coordinator.port" 120
victim=$(child_pid "$PID_killed" "grps-coordinator") || fail "no coordinator child"
snapshot=$(watch_run_until "$killed" "int(j.get('global_step', 0)) >= 300" 120) ||
  fail "the killed job never reached step 300"
kill -KILL "$victim"
at=$(json 'int(j.get("global_step", 0))' <<<"$snapshot")
echo "killed the coordinator (pid $victim) at global step $at"
# A kill at the job's end would test no take-over mid-job.
[ "$at" -lt 600 ] || fail "the coordinator kill came too late: global step $at, the job (nearly) over"
wait_pid "$PID_killed" 200
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE after the coordinator was killed"
grep -q "took over job" "$killed"/coordinator*.log || fail "no coordinator took the job over"
"$PYTHON" "$(dirname "$0")/check_examples.py" $((60000 / 64 * 64)) 2 "$killed"/examples-worker-*.log \
  || fail "after the coordinator kill, the examples trained are not each epoch's, exactly once"
"$PYTHON" - "$killed/result.json" <<'PY' || fail "result.json is wrong after the coordinator kill"
import json, sys
d = json.load(open(sys.argv[1]))["data"]
assert d["trained"] == d["total_blocks"] and d["refused_reports"] == 0, d
print("coordinator killed past step 300: %d of %d blocks trained, none refused" %
      (d["trained"], d["total_blocks"]))
PY
echo "PASS"
