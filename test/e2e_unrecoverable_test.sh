#!/usr/bin/env bash
# A fault that cannot be recovered ends the job, never hangs it. Daemons are
# started by hand (no launcher to restart anything), then:
#   1. a server is killed with SIGKILL and nothing takes its shard: after the
#      recovery timeout the job is FAILED with the reason, and the
#      coordinator, the other server and the workers all exit non-zero;
#   2. every worker is killed before finishing: FAILED the same way;
#   3. the coordinator is killed and not restarted: the servers and workers
#      exit non-zero once it has been silent for the coordinator timeout.
# Each case is bounded: every process must be gone within its stated time.
set -euo pipefail
BIN=${1:?usage: e2e_unrecoverable_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

RECOVERY_MS=3000
COORD_TIMEOUT_MS=4000

# job CASE: starts a coordinator, 2 servers and 2 workers named CASE-*.
job() {
  local c=$1
  start "$c-coordinator" "$BIN/grps-coordinator" --listen=127.0.0.1:0 \
    --port_file="$WORK/$c.port" --job_id="$c" --mode=sync --servers=2 --workers=2 \
    --dataset="$DATA" --steps=100000 --batch=32 --train_limit=6000 --test_limit=500 \
    --hidden=32 --eval_every=0 --heartbeat_ms=100 --heartbeat_timeout_ms=1000 \
    --recovery_timeout_ms=$RECOVERY_MS --coordinator_timeout_ms=$COORD_TIMEOUT_MS --linger_ms=1000
  wait_for_file "$WORK/$c.port" 30
  local address=127.0.0.1:$(cat "$WORK/$c.port")
  start "$c-server0" "$BIN/grps-server" --coordinator="$address" --shard=0
  start "$c-server1" "$BIN/grps-server" --coordinator="$address" --shard=1
  start "$c-worker0" "$BIN/grps-worker" --coordinator="$address" --rank=0 --backend=cpu
  start "$c-worker1" "$BIN/grps-worker" --coordinator="$address" --rank=1 --backend=cpu
  local i
  for ((i = 0; i < 600; i++)); do
    step=$("$BIN/grpsctl" --coordinator="$address" --json status 2>/dev/null \
             | json 'int(j.get("global_step", 0))' 2>/dev/null || echo 0)
    [ "$step" -ge 20 ] && return 0
    sleep 0.1
  done
  fail "$c: the job never trained"
}

pid_of() { local v="PID_${1//-/_}"; echo "${!v}"; }

# expect_exit CASE NAME SECONDS [nonzero|zero]
expect_exit() {
  wait_pid "$(pid_of "$1-$2")" "$3"
  [ "$EXIT_CODE" != timeout ] || fail "$1: $2 still running after $3 s (a hang)"
  if [ "${4:-nonzero}" = nonzero ]; then
    [ "$EXIT_CODE" != 0 ] || fail "$1: $2 exited 0 from a failed job"
  fi
  echo "$1: $2 exited with $EXIT_CODE"
}

# 1. A shard gone for good.
job shard
t0=$(date +%s)
kill -KILL "$(pid_of shard-server1)"
expect_exit shard coordinator 30
grep -q "shard 1" "$WORK/shard-coordinator.log" || fail "shard: the reason does not name shard 1"
for d in server0 worker0 worker1; do expect_exit shard "$d" 90; done
echo "shard: every daemon gone $(( $(date +%s) - t0 )) s after the kill"

# 2. Every worker dead before finishing.
job workers
kill -KILL "$(pid_of workers-worker0)" "$(pid_of workers-worker1)"
expect_exit workers coordinator 30
grep -qi "every worker" "$WORK/workers-coordinator.log" || fail "workers: no reason given"
for d in server0 server1; do expect_exit workers "$d" 90; done

# 3. The coordinator gone for good.
job coord
t0=$(date +%s)
kill -KILL "$(pid_of coord-coordinator)"
for d in server0 server1 worker0 worker1; do expect_exit coord "$d" 90; done
echo "coord: every daemon gone $(( $(date +%s) - t0 )) s after the kill"
echo "PASS"
