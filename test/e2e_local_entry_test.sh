#!/usr/bin/env bash
# End to end: `grps-local --entry "CMD"` runs the user's own PyTorch script as
# the job's workers (python/tests/odd_cnn_worker.py, through grps.torch from
# the build tree, with nothing set up by hand) against real daemons:
#   - 2 servers, 2 workers in sync, 30 steps: grps-local exits 0 and its
#     result JSON says the job completed, the model is the user's and every
#     worker ran 30 steps; each worker has its log, and its curve
#     (GRPS_CURVE_CSV) holds what the script reported: done()'s figures;
#   - a longer job (sync) with worker 1 killed (SIGKILL) mid-job and
#     --restart_workers=1: grps-local starts the script again with
#     GRPS_RANK=1, it takes its rank back (the coordinator re-registers
#     rank 1) and the job completes.
set -euo pipefail
BIN=${1:?usage: e2e_local_entry_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=/usr/bin/python3
[ -f "$BIN/../python/grps/__init__.py" ] ||
  { echo "SKIP: no grps Python package in $BIN/../python (scripts/setup installs pybind11)"; exit 77; }
"$PYTHON" -c "import torch" 2>/dev/null || { echo "SKIP: $PYTHON has no torch"; exit 77; }
# The workers import python/tests/odd_cnn.py: no __pycache__ in the tree.
export PYTHONDONTWRITEBYTECODE=1
WORKER="$REPO/python/tests/odd_cnn_worker.py"
JOB=(--servers 2 --workers 2 --optimizer sgd --lr 0.05 --timeout_s 120)

# check_result RUN_DIR PYTHON-CHECKS: asserts over the result JSON `r`.
check_result() {
  python3 - "$1/result.json" "$2" <<'PY' || fail "$1/result.json is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
try:
    exec(sys.argv[2])
except AssertionError as e:
    print("result check failed:", e, json.dumps(r, indent=1))
    sys.exit(1)
PY
}

# 1. A plain run.
run=$WORK/run-plain
start local-plain "$BIN/grps-local" --entry "$PYTHON $WORKER --steps 30" "${JOB[@]}" \
  --mode sync --run_dir "$run" --result_json "$run/result.json"
wait_pid "$PID_local_plain" 130
[ "$EXIT_CODE" = 0 ] || fail "grps-local --entry exited with $EXIT_CODE"
check_result "$run" '
assert r["exit"] == "ok", "the job completed"
assert r["model"] == "user", "the model is the script'"'"'s"
assert r["workers"] == 2 and r["steps"] == 30, "30 steps per worker"
assert r["workers_died"] == 0, "nobody died"'
for rank in 0 1; do
  grep -q "registered as rank $rank of 2" "$run/worker-$rank.log" ||
    fail "worker-$rank.log does not show the script joining as rank $rank"
done
for rank in 0 1; do
  curve="$run/curve-worker-$rank.csv"
  header=step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,evaluated
  [ "$(head -n 1 "$curve")" = "$header,test_auc" ] ||
    fail "$curve lacks grps-worker's header"
  tail -n 1 "$curve" | grep -q '^30,.*,0.000000,0.000000,1,-1.000000$' ||
    fail "$curve's last row is not done()'s evaluation at step 30: $(tail -n 1 "$curve")"
done
! grep -q "no plot" "$WORK/local-plain.log" || fail "grps-local spoke of a plot no worker could draw"
echo "plain: completed, 30 steps per worker, $(json '"%.1f" % j["wall_seconds"]' <"$run/result.json") s"

# 2. Worker 1 killed mid-job, restarted by grps-local: it gets its rank
# back once the old one is declared dead (1 s without a heartbeat; the
# restart asks again about every 1.5 s), while the survivor trains on, paced
# at 20 ms a step for 300 steps (6 s). Sync: the restarted script resumes at
# its rank's step (gt.step()) and joins the others' step.
run=$WORK/run-kill
start local-kill "$BIN/grps-local" --entry "$PYTHON $WORKER --steps 300 --pace_ms 20" \
  "${JOB[@]}" --mode sync --heartbeat_ms 100 --heartbeat_timeout_ms 1000 --restart_workers 1 \
  --run_dir "$run" --result_json "$run/result.json"
for ((i = 0; i < 600; i++)); do
  [ -f "$run/coordinator.port" ] && [ "$(global_step "$run")" -ge 40 ] && break
  kill -0 "$PID_local_kill" 2>/dev/null || fail "the job ended before worker 1 was killed"
  sleep 0.05
done
[ "$(global_step "$run")" -ge 40 ] || fail "the job never reached step 40"
victim=""
for pid in $(pgrep -P "$PID_local_kill"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx GRPS_RANK=1; then victim=$pid; fi
done
[ -n "$victim" ] || fail "no child of grps-local has GRPS_RANK=1"
command=$(tr '\0' ' ' <"/proc/$victim/cmdline")
step_at_kill=$(global_step "$run")
kill -KILL "$victim"
echo "kill: killed worker 1 (pid $victim: $command) at global step $step_at_kill"
wait_pid "$PID_local_kill" 130
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE after a worker was killed"
grep -q "worker-1 killed by signal 9 .*restarting it with GRPS_RANK=1" "$WORK/local-kill.log" ||
  fail "grps-local did not say it restarted worker 1"
grep -q "rank 1 .*re-registered\|re-registered rank 1" "$run/coordinator.log" ||
  fail "the coordinator did not log rank 1 rejoining"
grep -q "registered as rank 1 of 2" "$run/worker-1.restart-1.log" ||
  fail "the restarted script did not join as rank 1"
check_result "$run" '
assert r["exit"] == "ok", "the job completed"
assert r["workers_died"] == 1 and r["workers_restarted"] == 1, "one death, one restart"
assert r["steps"] >= 300, "every worker ran its steps"'
echo "kill: completed after the restart, $(json '"%.1f" % j["wall_seconds"]' <"$run/result.json") s"
echo PASS
