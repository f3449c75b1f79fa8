#!/usr/bin/env bash
# Ctrl-C in mid-training: grps-local tears the whole job down and leaves no
# process behind.
set -euo pipefail
BIN=${1:?usage: launcher_sigint_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
# 77: ctest reports the test as skipped, not passed.
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

RUN=$WORK/run
start local "$BIN/grps-local" --run_dir="$RUN" --steps=100000 --train_limit=4000 \
  --test_limit=500 --hidden=32 --eval_every=0 --backend=cpu

# Wait until training is under way: both workers have written curve rows.
for ((i = 0; i < 600; i++)); do
  if [ -f "$RUN/coordinator.port" ] && status "$RUN" >"$WORK/status.json" &&
     [ "$(json 'int(j.get("global_step", 0))' <"$WORK/status.json")" -ge 20 ]; then
    break
  fi
  sleep 0.1
done
[ "$(json 'int(j.get("global_step", 0))' <"$WORK/status.json" 2>/dev/null || echo 0)" -ge 20 ] \
  || fail "training never got going"

children=$(pgrep -P "$PID_local" | tr '\n' ' ')
[ "$(echo $children | wc -w)" -eq 5 ] || fail "expected 5 children, found: $children"
echo "children of grps-local: $children"

kill -INT "$PID_local"
wait_pid "$PID_local" 30
code=$EXIT_CODE
[ "$code" != timeout ] || fail "grps-local did not exit within 30 s of SIGINT"
echo "grps-local exited with $code after SIGINT"
[ "$code" = 130 ] || fail "grps-local exit code $code, expected 130"

sleep 0.5
for pid in $children; do
  if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]; then
    fail "child $pid ($(ps -o args= -p "$pid")) is still running"
  fi
done
leftover=$(pgrep -f -- "$RUN" || true)
[ -z "$leftover" ] || fail "processes still mention the run dir: $leftover"
echo "PASS: no process left behind"
