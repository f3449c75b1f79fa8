#!/usr/bin/env bash
# Authentication is decided per call, never per connection, against real
# daemons started with the job's two tokens (a coordinator, one server, one
# worker; async, so one rank trains whatever the other does). An outside
# client (grps-auth-load), every call of a run on ONE channel:
#   1. RUNS runs of THREADS threads x CALLS heartbeats as rank 0, with its
#      member secret: all OK, and the coordinator stays up;
#   2. the same with pushes to the server: all OK, the server stays up;
#   3. SHARD_STATUS_CALLS GetShardStatus with the admin token: the server's
#      resident memory (VmRSS, /proc) grows by less than 1 MiB (after 10,000
#      calls of warm-up);
#   4. two tokens on one channel: StopJob with the worker token after a call
#      with the admin token is PERMISSION_DENIED, CheckpointJob with the
#      admin token after a call with the worker token is not;
#   5. a registration for rank 1 while its worker trains: ALREADY_EXISTS, and
#      the worker goes on training with its incarnation; once the worker is
#      killed (SIGKILL) and declared dead, the same registration is granted.
# The defaults are the short run (CI); the long one, as docs/security.md
# quotes it: RUNS=10 CALLS=10000 SHARD_STATUS_CALLS=100000.
set -euo pipefail
BIN=${1:?usage: e2e_auth_per_call_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
RUNS=${RUNS:-1}
THREADS=${THREADS:-8}
CALLS=${CALLS:-1500}
SHARD_STATUS_CALLS=${SHARD_STATUS_CALLS:-50000}
TIMEOUT_MS=1500

GRPS_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
GRPS_WORKER_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export GRPS_TOKEN GRPS_WORKER_TOKEN
COORD=127.0.0.1:$(free_port)
start coordinator "$BIN/grps-coordinator" --listen="$COORD" --mode=async --servers=1 \
  --workers=2 --steps=1000000 --eval_every=0 --heartbeat_ms=100 \
  --heartbeat_timeout_ms=$TIMEOUT_MS --checkpoint_dir="$WORK/ckpt"
start server "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0
wait_until "$COORD" "j['shards'][0]['state'] == 'MEMBER_STATE_ALIVE'" 30 "the server to register"

alive() {  # NAME PID
  kill -0 "$2" 2>/dev/null || fail "the $1 died (pid $2)"
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
load() { "$BIN/grps-auth-load" --coordinator="$COORD" --wait_s=10 "$@"; }

# runs RPC DAEMON PID: RUNS runs of `--rpc=RPC` as rank 0; every call must be
# OK and DAEMON must stay up.
runs() {
  local run out
  for ((run = 1; run <= RUNS; run++)); do
    out=$(load --rpc="$1" --rank=0 --threads="$THREADS" --calls="$CALLS") ||
      { echo "$out"; alive "$2" "$3"; fail "$1 run $run: not every call was OK"; }
    echo "run $run: ${out##*$'\n'}"
    alive "$2" "$3"
  done
}

echo "== 1. $RUNS x $THREADS threads x $CALLS heartbeats as rank 0, one channel"
runs heartbeat coordinator "$PID_coordinator"
echo "== 2. $RUNS x $THREADS threads x $CALLS pushes to the server, one channel"
runs push server "$PID_server"

echo "== 3. the server's memory over $SHARD_STATUS_CALLS authenticated calls on one channel"
load --rpc=shard_status --threads=1 --calls=10000 >/dev/null || fail "warm-up GetShardStatus failed"
before=$(rss_kib "$PID_server")
out=$(load --rpc=shard_status --threads=1 --calls="$SHARD_STATUS_CALLS") ||
  { echo "$out"; fail "GetShardStatus: not every call was OK"; }
after=$(rss_kib "$PID_server")
echo "$out"
echo "server VmRSS: $before KiB before, $after KiB after: $((after - before)) KiB growth"
[ $((after - before)) -lt 1024 ] || fail "the server's RSS grew by $((after - before)) KiB"

echo "== 4. two tokens on one channel"
load --rpc=roles || fail "a call got the role of another call's token"

echo "== 5. a live rank is not handed over"
start worker "$BIN/grps-worker" --coordinator="$COORD" --rank=1 --backend=cpu \
  --blas_threads=1 --straggle_ms=2
RANK1="[w for w in j['workers'] if w['rank'] == 1][0]"
STEP1="int($RANK1.get('progress', {}).get('step', 0))"
wait_until "$COORD" "$RANK1['state'] == 'MEMBER_STATE_ALIVE' and $STEP1 > 10" 60 "worker 1 to train"
incarnation=$(field_at "$COORD" "$RANK1['incarnation']" none)
step=$(field_at "$COORD" "$STEP1" 0)
out=$("$BIN/grps-auth-load" --coordinator="$COORD" --rpc=register --rank=1) &&
  fail "a registration took live rank 1: $out"
echo "$out"
grep -q "refused: ALREADY_EXISTS: worker rank 1 is alive" <<<"$out" || fail "not refused as ALREADY_EXISTS"
sleep 1
alive worker "$PID_worker"
[ "$(field_at "$COORD" "$RANK1['incarnation']" none)" = "$incarnation" ] ||
  fail "rank 1 changed incarnation"
[ "$(field_at "$COORD" "$STEP1" 0)" -gt "$step" ] ||
  fail "worker 1 stopped training"
echo "rank 1 keeps incarnation $incarnation and trains"
kill -KILL "$PID_worker"
out=$(load --rpc=register --rank=1 --wait_s=$((TIMEOUT_MS / 1000 + 10))) ||
  { echo "$out"; fail "rank 1 was not granted after its worker was declared dead"; }
echo "$out"
granted=$(sed -n 's/.*after [0-9]* tries, \([0-9.]*\) s$/\1/p' <<<"$out")
python3 -c "import sys; sys.exit(0 if $granted * 1000 >= $TIMEOUT_MS / 2 else 1)" ||
  fail "rank 1 was granted after $granted s, before its worker could be declared dead"
alive coordinator "$PID_coordinator"
alive server "$PID_server"
"$BIN/grpsctl" --coordinator="$COORD" stop >/dev/null
echo "PASS"
