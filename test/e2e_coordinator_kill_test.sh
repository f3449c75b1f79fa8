#!/usr/bin/env bash
# Training goes on while the coordinator is away, and a restarted coordinator
# takes the job back. grps-local runs a sync job (2 servers, 2 workers); past
# step 300 (once a checkpoint is complete, or at step 500 without one) the
# coordinator is killed with SIGKILL; grps-local
# restarts it on the same port with its state folder. Then:
#   - the job completes and grps-local exits 0 (every daemon exited 0);
#   - the new coordinator says it took the job back;
#   - the global step moved on while no coordinator was there or right after;
#   - the final accuracy is that of an undisturbed job: losing the control
#     plane does not change the weights.
set -euo pipefail
BIN=${1:?usage: e2e_coordinator_kill_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

STEPS=1500
# The worker of rank 0 sleeps 3 ms after every step (it changes no value): the
# job lasts seconds whatever the machine's speed, so the kill lands mid-run.
PACE=(--straggler_rank=0 --straggle_ms=3)
launch() {  # NAME
  local run=$WORK/$1
  start "$1" "$BIN/grps-local" --run_dir="$run" --result_json="$run/result.json" \
    --mode=sync --servers=2 --workers=2 --steps=$STEPS --batch=32 --train_limit=6000 \
    --test_limit=1000 --hidden=64 --eval_every=0 --backend=cpu --heartbeat_ms=100 \
    --heartbeat_timeout_ms=1000 --checkpoint_dir="$run/checkpoints" \
    --checkpoint_every_steps=100 --timeout_s=200 "${PACE[@]}"
}

launch calm
wait_pid "$PID_calm" 200
[ "$EXIT_CODE" = 0 ] || fail "undisturbed run: grps-local exited with $EXIT_CODE"

launch killed
run=$WORK/killed
# Past step 300, after a checkpoint if one is complete by then (on a loaded
# machine a checkpoint's fsync can stall for long; the coordinator's own
# state file is all a restarted coordinator needs). The status is streamed:
# with two status reads a sample (each up to 1.5 s on a loaded machine) the
# kill once came some 750 steps in, 2.7 s before the job's last step.
# The victim is found first: the kill follows the snapshot at once.
wait_for_file "$run/coordinator.port" 120
victim=$(child_pid "$PID_killed" "grps-coordinator ") || fail "no coordinator child"
snapshot=$(watch_run_until "$run" \
  "int(j.get('global_step', 0)) >= 300 and (int(j.get('last_checkpoint', {}).get('id', 0)) > 0 or int(j.get('global_step', 0)) >= 500)" \
  120) || fail "the job never reached step 300"
kill -KILL "$victim"
before=$(json 'int(j.get("global_step", 0))' <<<"$snapshot")
echo "killed the coordinator (pid $victim) at global step $before of $STEPS"
# The kill must land mid-run (else nothing is tested): well before the end.
[ "$before" -lt $((STEPS - 300)) ] || fail "the kill came too late: global step $before of $STEPS"
wait_pid "$PID_killed" 200
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE after the coordinator was killed"
grep -q "coordinator killed by signal 9.*restarting it on port" "$WORK/killed.log" \
  || fail "grps-local did not restart the coordinator"
grep -qi "took over job" "$run/coordinator.restart-1.log" \
  || fail "the restarted coordinator did not take the job back"
calm=$(json 'j["final_test_accuracy"]' <"$WORK/calm/result.json")
killed=$(json 'j["final_test_accuracy"]' <"$run/result.json")
echo "final accuracy $killed with the coordinator killed, $calm undisturbed"
[ "$calm" = "$killed" ] || fail "accuracy $killed differs from the undisturbed $calm"
echo "PASS"
