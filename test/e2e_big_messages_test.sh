#!/usr/bin/env bash
# What a client can make a daemon hold with big messages. While grps-local
# trains the default job (with tokens) for nine epochs, long enough to
# outlast the floods on a loaded machine, grps-flood-client sends eight
# 200 MiB messages at once (1.6 GiB), three times:
#   - to a server's Push without a token: refused on its headers
#     (UNAUTHENTICATED);
#   - to a server's Push with the worker token: refused while it arrives
#     (RESOURCE_EXHAUSTED, the server's gRPC memory quota);
#   - to the coordinator's RegisterWorker with the worker token: the same.
# Neither daemon's peak memory (VmHWM) rises by 800 MB, half of what was
# sent (without the quota, the server's rose by 1086 MB; with it, by 100 to
# 200 MB on an idle machine and up to 563 MB with every core busy: gRPC
# 1.51 resets streams as it reclaims memory, which lags under load), the
# workers ride it out (a push refused for memory is retried), and the job
# completes with test accuracy >= 0.85.
set -euo pipefail
BIN=${1:?usage: e2e_big_messages_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

ADMIN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORKER=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
RUN=$WORK/run
GRPS_TOKEN=$ADMIN GRPS_WORKER_TOKEN=$WORKER start local "$BIN/grps-local" --run_dir="$RUN" \
  --result_json="$RUN/result.json" --backend=cpu --timeout_s=280 \
  --epochs=9 --straggler_rank=0 --straggle_ms=3
wait_for_file "$RUN/coordinator.port" 30
COORD=127.0.0.1:$(cat "$RUN/coordinator.port")

for ((i = 0; i < 300; i++)); do
  state=$(status "$RUN" | json 'j.get("state", "")' 2>/dev/null || true)
  [ "$state" = JOB_STATE_RUNNING ] && break
  sleep 0.1
done
[ "$state" = JOB_STATE_RUNNING ] || fail "the job did not start running (state: $state)"
SERVER=$(status "$RUN" | json "[s['address'] for s in j['shards'] if int(s.get('shard', 0)) == 0][0]")
SERVER_PID=$(child_pid "$PID_local" grps-server) || fail "no grps-server under grps-local"
COORD_PID=$(child_pid "$PID_local" grps-coordinator) || fail "no grps-coordinator under grps-local"

hwm_mb() { awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$1/status" 2>/dev/null || true; }
# flood TARGET METHOD TOKEN EXPECTED_CODE: eight 200 MiB calls, each refused
# with EXPECTED_CODE.
flood() {
  local out
  echo "  (at global step $(global_step "$RUN"), ${SECONDS} s into the test)"
  out=$("$BIN/grps-flood-client" --target="$1" --method="$2" --mib=200 --count=8 \
    ${3:+--token=$3}) || fail "grps-flood-client failed: $out"
  echo "$out" | sed 's/^/  /'
  [ "$(grep -c "^$4" <<<"$out")" = 8 ] || fail "expected 8 calls refused with $4"
}
# rise WHAT BEFORE_MB NOW_MB
rise() {
  [ -n "$3" ] || fail "$1: the daemon is gone (exited before the job ended)"
  echo "$1: peak memory $2 MB before, $3 MB after"
  [ $(($3 - $2)) -lt 800 ] || fail "$1: peak memory rose by $(($3 - $2)) MB"
}

before=$(hwm_mb "$SERVER_PID")
echo "server $SERVER (pid $SERVER_PID), no token:"
flood "$SERVER" /grps.v1.ParameterServer/Push "" UNAUTHENTICATED
rise "server, no token" "$before" "$(hwm_mb "$SERVER_PID")"
echo "server, worker token:"
flood "$SERVER" /grps.v1.ParameterServer/Push "$WORKER" RESOURCE_EXHAUSTED
rise "server, worker token" "$before" "$(hwm_mb "$SERVER_PID")"

before=$(hwm_mb "$COORD_PID")
echo "coordinator $COORD (pid $COORD_PID), worker token:"
flood "$COORD" /grps.v1.Coordinator/RegisterWorker "$WORKER" RESOURCE_EXHAUSTED
rise "coordinator, worker token" "$before" "$(hwm_mb "$COORD_PID")"

wait_pid "$PID_local" 290
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
acc=$(json 'j["final_test_accuracy"]' <"$RUN/result.json")
echo "final test accuracy: $acc"
python3 -c "import sys; sys.exit(0 if $acc >= 0.85 else 1)" || fail "accuracy $acc < 0.85"
echo "PASS"
