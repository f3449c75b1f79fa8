#!/usr/bin/env bash
# Members started before their coordinator (as pods are, in any order)
# register as soon as it listens. A server and two workers start first; their
# first registrations are refused; the coordinator starts a second later.
# Every member must be registered within BOUND_S of the coordinator's
# "listening" line, and the job must complete. (Before, a refused member's
# retries failed fast on gRPC's memory of the refusal: no call waited on the
# channel, so it made no new connection, and the workers registered 10 s late,
# when an attempt had run out. One never registered before its coordinator was
# killed, in e2e_coordinator_gone_test.)
set -euo pipefail
BIN=${1:?usage: e2e_members_before_coordinator_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

BOUND_S=3
COORD=127.0.0.1:$(free_port)
start server "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0
start worker0 "$BIN/grps-worker" --coordinator="$COORD" --rank=0 --backend=cpu --blas_threads=1
start worker1 "$BIN/grps-worker" --coordinator="$COORD" --rank=1 --backend=cpu --blas_threads=1
for name in server worker0 worker1; do
  wait_for_line "$WORK/$name.log" "not registered yet" 10  # each is refused first
done
start coordinator "$BIN/grps-coordinator" --listen="$COORD" --mode=sync --servers=1 \
  --workers=2 --steps=100 --batch=32 --train_limit=3000 --test_limit=500 --hidden=16 \
  --eval_every=0

for name in server worker0 worker1; do
  pid_var=PID_$name
  wait_pid "${!pid_var}" 60
  [ "$EXIT_CODE" = 0 ] || fail "$name exited $EXIT_CODE, not 0"
done
# Seconds from the coordinator's "listening" line to each registration.
python3 - "$WORK/coordinator.log" "$BOUND_S" <<'PY' || fail "a member registered late"
import datetime, re, sys
def at(line):
    return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S.%f")
lines = open(sys.argv[1]).read().splitlines()
listening = at(next(l for l in lines if "listening on" in l))
joins = [(re.search(r"registered (shard \d+|rank \d+)", l).group(1), at(l))
         for l in lines if re.search(r"registered (shard|rank) \d+", l)]
late = False
for who, t in joins:
    delay = (t - listening).total_seconds()
    print(f"{who} registered {delay:.2f} s after the coordinator listened")
    late |= delay > float(sys.argv[2])
sys.exit(1 if late or len(joins) != 3 else 0)
PY
echo "PASS"
