#!/usr/bin/env bash
# A server killed with SIGKILL and started again by hand on a *different*
# address (as a rescheduled pod would be) takes its shard back: it registers
# for the same shard with its new address, the shard map's epoch goes up, the
# workers learn the new map from their heartbeats and dial the new address,
# the job rolls back to the newest checkpoint and completes. Every daemon is
# started by hand and every exit status is checked.
set -euo pipefail
BIN=${1:?usage: e2e_server_moves_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

STEPS=800
# Each worker sleeps PACE_MS after every step, so that the job lasts seconds
# whatever the machine's speed and the kill always lands mid-run (unpaced,
# 800 steps can end within the status polls' first second).
PACE_MS=5

start coordinator "$BIN/grps-coordinator" --listen=127.0.0.1:0 \
  --port_file="$WORK/coordinator.port" --job_id=moves --mode=sync --servers=2 --workers=2 \
  --steps=$STEPS --batch=32 --train_limit=6000 --test_limit=1000 --hidden=64 --eval_every=0 \
  --heartbeat_ms=100 --heartbeat_timeout_ms=1000 --checkpoint_dir="$WORK/ckpt" \
  --checkpoint_every_steps=100 --recovery_timeout_ms=20000 --coordinator_timeout_ms=30000 \
  --linger_ms=1000
wait_for_file "$WORK/coordinator.port" 20
COORD=127.0.0.1:$(cat "$WORK/coordinator.port")
for s in 0 1; do
  start "server-$s" "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0 --shard=$s
done
for w in 0 1; do
  start "worker-$w" "$BIN/grps-worker" --coordinator="$COORD" --rank=$w --backend=cpu \
    --straggle_ms=$PACE_MS
done

# The status is streamed and server 1 killed on the first snapshot past a
# complete checkpoint: with two status reads after the wait's own (each up
# to 1.5 s on a loaded machine) the kill came a few seconds before the
# job's last step.
snapshot=$(watch_until "$COORD" "j.get('last_checkpoint', {}).get('state') == 'CHECKPOINT_STATE_COMPLETE' and int(j.get('global_step', 0)) > int(j['last_checkpoint'].get('step', 0))" \
  60) || fail "no complete checkpoint within 60 s"
kill -KILL "$PID_server_1"
wait "$PID_server_1" 2>/dev/null || true
old=$(json "[s['address'] for s in j['shards'] if int(s.get('shard', 0)) == 1][0]" <<<"$snapshot" 2>/dev/null || true)
step=$(json "int(j.get('global_step', 0))" <<<"$snapshot")
[ -n "$old" ] || fail "no address for shard 1 in the status"
echo "killed server 1 ($old) at global step $step of $STEPS"
[ "$step" -lt $((STEPS - 100)) ] || fail "the kill came too late: global step $step of $STEPS, the job (nearly) over"

# The replacement listens on a port of its own (127.0.0.1:0: a new one).
start server-1-moved "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0 --shard=1
wait_until "$COORD" "[s['address'] for s in j['shards'] if int(s.get('shard', 0)) == 1][0] != '$old'" \
  30 "shard 1 to register its new address"
new=$(field_at "$COORD" "[s['address'] for s in j['shards'] if int(s.get('shard', 0)) == 1][0]" "")
echo "shard 1 moved: $old -> $new"

for d in worker-0 worker-1 server-0 server-1-moved coordinator; do
  var=PID_${d//-/_}
  wait_pid "${!var}" 120
  [ "$EXIT_CODE" = 0 ] || fail "$d exited with $EXIT_CODE"
done
grep -q "rolled back to checkpoint" "$WORK/server-0.log" || fail "shard 0 did not roll back"
for w in 0 1; do
  grep -q "following shard map epoch" "$WORK/worker-$w.log" || fail "worker $w did not follow the new map"
done
grep -q "job moves completed" "$WORK/coordinator.log" || fail "the coordinator did not say the job completed"
echo "PASS"
