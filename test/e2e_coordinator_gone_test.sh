#!/usr/bin/env bash
# A member never waits forever for a coordinator that is gone. A coordinator,
# a server and two workers are started by hand (sync, with
# --coordinator_timeout_ms=3000, one backup worker); worker 1 trains slowly,
# so worker 0 runs ahead. Near worker 0's last step the coordinator is killed
# (SIGKILL) and never comes back: worker 0 reports WorkerDone to nobody while
# worker 1 still trains. Every other daemon must exit 1, within the coordinator timeout
# plus a margin for the machine (15 s in all), and say why. (Before, a worker
# whose WorkerDone met the dead coordinator retried it forever: the retry
# helper took its own "giving up" for a passing UNAVAILABLE.)
set -euo pipefail
BIN=${1:?usage: e2e_coordinator_gone_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

TIMEOUT_MS=3000
BOUND_S=15
COORD=127.0.0.1:$(free_port)
start coordinator "$BIN/grps-coordinator" --listen="$COORD" --mode=sync --servers=1 \
  --workers=2 --steps=400 --batch=32 --train_limit=6000 --test_limit=500 --hidden=32 \
  --eval_every=0 --heartbeat_ms=100 --heartbeat_timeout_ms=1000 \
  --coordinator_timeout_ms=$TIMEOUT_MS --backup_workers=1
start server "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0
start worker0 "$BIN/grps-worker" --coordinator="$COORD" --rank=0 --backend=cpu --blas_threads=1 \
  --straggle_ms=5
start worker1 "$BIN/grps-worker" --coordinator="$COORD" --rank=1 --backend=cpu --blas_threads=1 \
  --straggle_ms=25

# Worker 0 is near its last step: it will report WorkerDone to a coordinator
# that is gone. Kill the coordinator then. Worker 0 trains its last 100 steps
# in about 0.6 s: a status read per sample (up to 1.5 s on a loaded machine)
# saw it past step 300 once it had finished (WorkerDone answered, then the
# kill: not the case this test is for), so the status is streamed.
watch_until "$COORD" "len(j['workers']) == 2 and all(w.get('incarnation') for w in j['workers']) and int([w for w in j['workers'] if w['rank'] == 0][0].get('progress', {}).get('step', 0)) >= 300" 120 \
  >/dev/null || fail "worker 0 never reached step 300 with worker 1 registered"
kill -KILL "$PID_coordinator"
killed=$(date +%s)
echo "coordinator killed; worker 1 still trains: $(grep -c . "$WORK/worker1.log") log lines"

for name in server worker0 worker1; do
  pid_var=PID_$name
  left=$((BOUND_S - ($(date +%s) - killed)))
  [ "$left" -gt 0 ] || left=1
  wait_pid "${!pid_var}" "$left"
  [ "$EXIT_CODE" != timeout ] ||
    fail "$name still runs $BOUND_S s after the coordinator was killed ($TIMEOUT_MS ms timeout)"
  [ "$EXIT_CODE" = 1 ] || fail "$name exited $EXIT_CODE, not 1"
  last=$(grep "\[error\]" "$WORK/$name.log" | tail -n 1 | sed 's/.*\[error\] //')
  echo "$name exited 1 after $(($(date +%s) - killed)) s: $last"
  grep -q "no \(word\|answer\) from the coordinator" <<<"$last" ||
    fail "$name did not say it lost the coordinator"
done
# The premise: worker 0 finished its steps after the kill, its WorkerDone
# met nobody (not: it had finished before, and then lost the coordinator).
grep "\[error\]" "$WORK/worker0.log" | tail -n 1 | grep -q "WorkerDone: no word from the coordinator" ||
  fail "worker 0 did not report WorkerDone to the gone coordinator (had it finished before the kill?)"
echo "PASS"
