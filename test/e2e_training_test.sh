#!/usr/bin/env bash
# End to end: a coordinator, 2 servers and 2 workers as separate processes on
# loopback ports they pick themselves. Trains 2000 sync steps on a slice of
# Fashion-MNIST to well above chance (a few seconds: long enough to be seen
# mid-run now that a step of this small model takes about a millisecond),
# checks `grpsctl status --json` against the live job, and checks that every
# process exits 0. Worker 0's gRPC health (--health_listen) says NOT_SERVING
# before it is registered and SERVING once it is.
set -euo pipefail
BIN=${1:?usage: e2e_training_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
# 77: ctest reports the test as skipped, not passed.
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

STEPS=2000
start coordinator "$BIN/grps-coordinator" --listen=127.0.0.1:0 --port_file="$WORK/coordinator.port" \
  --job_id=e2e --mode=sync --servers=2 --workers=2 --steps=$STEPS --batch=32 \
  --train_limit=6000 --test_limit=2000 --eval_every=100 --hidden=64 \
  --heartbeat_ms=200 --heartbeat_timeout_ms=3000 --linger_ms=3000
wait_for_file "$WORK/coordinator.port" 20
COORD=127.0.0.1:$(cat "$WORK/coordinator.port")
# Worker 0 comes first, with a health port: NOT_SERVING while it cannot
# register (no server yet), SERVING once it has.
HEALTH=127.0.0.1:$(free_port)
start worker-0 "$BIN/grps-worker" --coordinator="$COORD" --backend=cpu \
  --curve_csv="$WORK/curve-0.csv" --health_listen="$HEALTH"
health=""
for ((i = 0; i < 100; i++)); do
  health=$("$BIN/grpsctl" health --address="$HEALTH" 2>&1 || true)
  [[ "$health" == *NOT_SERVING* ]] && break
  sleep 0.1
done
[[ "$health" == *NOT_SERVING* ]] || fail "worker 0's health before the job formed: $health"
echo "before registration: $health"
for s in 0 1; do
  start server-$s "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0
done
start worker-1 "$BIN/grps-worker" --coordinator="$COORD" --backend=cpu \
  --curve_csv="$WORK/curve-1.csv"
for ((i = 0; i < 100; i++)); do
  "$BIN/grpsctl" health --address="$HEALTH" >/dev/null 2>&1 && break
  sleep 0.1
done
health=$("$BIN/grpsctl" health --address="$HEALTH" 2>&1) \
  || fail "worker 0's health once registered: $health"
echo "registered: $health"
other=$("$BIN/grps-flood-client" --target="$HEALTH" --method=/grps.v1.Coordinator/GetJobStatus \
  --mib=1 --count=1 2>&1 || true)
[[ "$other" == UNIMPLEMENTED* ]] || fail "worker 0's health port served another method: $other"
echo "the health port, asked for GetJobStatus: $other"
# Keep the last snapshot of the job: the coordinator exits when it is done.
start watch "$BIN/grpsctl" --coordinator="$COORD" --json --interval_ms=200 watch

# While it runs: grpsctl status agrees with the job. Workers report their
# progress in heartbeats (every 200 ms, up to ~200 steps here), so the snapshot is
# taken once both have reported a step of training and neither has finished.
live=0
for ((i = 0; i < 600; i++)); do
  if "$BIN/grpsctl" --coordinator="$COORD" --json status >"$WORK/status.json" 2>/dev/null; then
    step=$(json 'int(j.get("global_step", 0))' <"$WORK/status.json")
    # 0 once a worker has finished: the job is no longer mid-run.
    reported=$(json 'min([int(w.get("progress", {}).get("step", 0)) if w["state"] == "MEMBER_STATE_ALIVE" else 0 for w in j["workers"]] or [0])' \
      <"$WORK/status.json")
    if [ "$step" -ge 20 ] && [ "$reported" -gt 0 ] && [ "$step" -lt $((STEPS - 20)) ]; then
      live=1; break
    fi
  fi
  sleep 0.1
done
[ $live = 1 ] || fail "never saw the job running between steps 20 and $((STEPS - 20))"
python3 - "$WORK/status.json" "$STEPS" <<'PY' || fail "grpsctl status --json disagrees with the job"
import json, sys
j = json.load(open(sys.argv[1]))
steps = int(sys.argv[2])
# Worker steps and shard versions arrive in separate heartbeats, so they may
# be a heartbeat or two apart: up to ~200 steps per 200 ms heartbeat here.
slack = 500
def check(cond, what):
    if not cond:
        print("status check failed:", what, json.dumps(j, indent=1)[:3000]); sys.exit(1)
check(j["job_id"] == "e2e", "job id")
check(j["state"] == "JOB_STATE_RUNNING", "state running")
check(j["mode"] == "MODE_SYNC", "mode sync")
step = int(j["global_step"])
check(int(j["total_steps"]) == steps, f"total steps {steps}")
workers = j["workers"]
check(sorted(w["rank"] for w in workers) == [0, 1], "two workers, ranks 0 and 1")
for w in workers:
    check(w["state"] == "MEMBER_STATE_ALIVE", "worker alive")
    s = int(w["progress"]["step"])
    # A worker may not yet have reported the steps of the last heartbeat
    # interval, but it cannot be ahead of the shards by more than the slack.
    # The exact check comes at the end of the job.
    check(s <= step + slack, f"worker step {s} not ahead of global step {step}")
    check(int(w["last_heartbeat_ms_ago"]) < 3000, "recent heartbeat")
shards = j["shards"]
check(sorted(s["shard"] for s in shards) == [0, 1], "two shards")
for s in shards:
    check(step <= int(s["version"]) <= step + slack, "global step is the lowest shard version")
    check(int(s["bytes_in"]) > 0 and int(s["bytes_out"]) > 0, "bytes in/out")
    check(int(s["updates_applied"]) > 0, "updates applied")
    check(int(s["num_chunks"]) > 0, "chunks")
print("status ok at step", step)
PY

# Every process exits 0 by itself.
for name in worker_0 worker_1 server_0 server_1 coordinator watch; do
  pid_var=PID_$name
  wait_pid "${!pid_var}" 120
  [ "$EXIT_CODE" = 0 ] || fail "$name exited with $EXIT_CODE"
done

# The last snapshot the coordinator streamed: the job as it ended.
grep '^{' "$WORK/watch.log" | tail -n 1 >"$WORK/final.json"
python3 - "$WORK/final.json" "$STEPS" <<'PY' || fail "the final status is wrong"
import json, sys
j = json.load(open(sys.argv[1]))
steps = int(sys.argv[2])
def check(cond, what):
    if not cond:
        print("final check failed:", what, json.dumps(j, indent=1)[:3000]); sys.exit(1)
check(j["state"] == "JOB_STATE_COMPLETED", "state completed")
check(int(j["global_step"]) == steps, f"global step {steps}")
for w in j["workers"]:
    check(w["state"] == "MEMBER_STATE_FINISHED", "worker finished")
    check(int(w["progress"]["step"]) == steps, f"worker at step {steps}")
for s in j["shards"]:
    check(int(s["version"]) == steps, f"shard version {steps}")
    # sync: one update per chunk per step, two pushes per chunk per step
    check(int(s["updates_applied"]) == steps * int(s["num_chunks"]), "updates = steps x chunks")
    check(int(s["pushes"]) == 2 * steps * int(s["num_chunks"]), "pushes = workers x steps x chunks")
    check(int(s["rejected_pushes"]) == 0, "no rejected pushes")
check(j.get("has_final_eval") is True, "final evaluation present")
print("final status ok")
PY

# Workers and servers on one machine: the values went through the workers'
# shared-memory lanes (all but the first pull of each worker), and the
# pushes after each worker's first to each shard were rung at the shards'
# doorbells in the lanes instead of called through gRPC.
for w in 0 1; do
  line=$(grep 'dense values:' "$WORK/worker-$w.log") || fail "worker $w did not report its bytes"
  echo "worker $w: ${line#*dense values: }"
  python3 - "$line" <<'PY' || fail "worker $w's values did not go through its lanes and doorbells: $line"
import re, sys
pushed, pulled, lanes = map(float, re.search(
    r"pushed ([0-9.]+) MiB and pulled ([0-9.]+) MiB, ([0-9.]+) MiB", sys.argv[1]).groups())
rung, calls = map(int, re.search(r"([0-9]+) of ([0-9]+) push calls rung", sys.argv[1]).groups())
sys.exit(0 if pushed > 0 and lanes >= 0.95 * (pushed + pulled) and rung >= 0.9 * calls else 1)
PY
done

final=$(json 'j["final_test_accuracy"]' <"$WORK/final.json")
echo "final test accuracy after $STEPS steps: $final"
python3 -c "import sys; sys.exit(0 if float('$final') >= 0.6 else 1)" \
  || fail "final accuracy $final is not well above chance (0.1)"
[ "$(wc -l <"$WORK/curve-0.csv")" -gt 3 ] || fail "no training curve"
echo "PASS"
