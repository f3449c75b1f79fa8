#!/usr/bin/env bash
# Per-shard checkpoint storage (--checkpoint_storage=per_shard), the layout
# of the Kubernetes manifests: each server keeps its shard's files on a
# volume of its own (here its own --checkpoint_dir), the coordinator only the
# manifests. A sync job (2 servers, 2 workers, separate daemons) checkpoints
# every 100 steps; once two checkpoints are complete:
#   - each folder holds what it should and nothing else: the coordinator's
#     ckpt-N/MANIFEST, server K's ckpt-N/shard-0000K.ckpt;
#   - server 1 is killed with SIGKILL, a byte of its file of the newest
#     complete checkpoint flips on its volume, and it is started again: it
#     finds the damage against the manifest that its restore order carries,
#     says so as it registers again, the coordinator refuses that checkpoint
#     and the whole job rolls back to the one before it (server 0 too);
#   - the job completes: every daemon exits 0, with a sane accuracy;
#   - a coordinator started on those manifests with another number of
#     servers refuses to start (exit 2), naming --servers.
set -euo pipefail
BIN=${1:?usage: e2e_per_shard_checkpoints_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

STEPS=1200
COORD_DIR=$WORK/coordinator-volume
JOB=(--job_id=per-shard --mode=sync --workers=2 --steps=$STEPS --batch=32 --train_limit=6000
     --test_limit=1000 --hidden=64 --eval_every=0 --heartbeat_ms=100 --heartbeat_timeout_ms=1000
     --recovery_timeout_ms=20000 --checkpoint_storage=per_shard --checkpoint_dir="$COORD_DIR"
     --checkpoint_every_steps=100)

start coordinator "$BIN/grps-coordinator" --listen=127.0.0.1:0 --port_file="$WORK/coordinator.port" \
  --servers=2 "${JOB[@]}"
wait_for_file "$WORK/coordinator.port" 20
COORD=127.0.0.1:$(cat "$WORK/coordinator.port")
server() {  # NAME SHARD
  start "$1" "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0 --shard="$2" \
    --checkpoint_dir="$WORK/server-$2-volume"
}
server server-0 0
server server-1 1
# One worker sleeps 3 ms after every step (it changes no value): the
# job lasts seconds whatever the machine's speed, so the kill lands mid-run.
start worker-0 "$BIN/grps-worker" --coordinator="$COORD" --backend=cpu --straggle_ms=3
start worker-1 "$BIN/grps-worker" --coordinator="$COORD" --backend=cpu

wait_until "$COORD" 'int(j.get("checkpoints_completed", 0)) >= 2 and
  int(j.get("global_step", 0)) > int(j.get("last_checkpoint", {}).get("step", 0))' 120 \
  "two complete checkpoints"

# What each volume holds.
layout() {  # DIR: "ckpt-N/FILE" per file, sorted
  (cd "$1" && find . -path './ckpt-*' -type f | sed 's|^\./||' | sort)
}
[ -z "$(layout "$COORD_DIR" | grep -v '/MANIFEST$')" ] \
  || fail "the coordinator's volume holds more than manifests: $(layout "$COORD_DIR" | tr '\n' ' ')"
for k in 0 1; do
  other=$(layout "$WORK/server-$k-volume" | grep -v "/shard-0000$k.ckpt\$" || true)
  [ -z "$other" ] || fail "server $k's volume holds another shard's files: $other"
done

kill -KILL "$PID_server_1"
wait "$PID_server_1" 2>/dev/null || true
# A checkpoint in progress can no longer complete (shard 1 is gone): once the
# coordinator has seen the death, the newest manifest stays the newest.
wait_until "$COORD" '[s for s in j.get("shards", []) if s.get("shard", 0) == 1 and
  s.get("state") == "MEMBER_STATE_DEAD"] != []' 20 "shard 1 declared dead"
newest=$(layout "$COORD_DIR" | sed -n 's|^ckpt-0*\([0-9]*\)/MANIFEST$|\1|p' | sort -n | tail -1)
previous=$(layout "$COORD_DIR" | sed -n 's|^ckpt-0*\([0-9]*\)/MANIFEST$|\1|p' | sort -n | tail -2 | head -1)
[ -n "$newest" ] && [ "$previous" != "$newest" ] || fail "fewer than two manifests"
victim=$WORK/server-1-volume/$(printf 'ckpt-%08d' "$newest")/shard-00001.ckpt
[ -f "$victim" ] || fail "server 1 has no file of checkpoint $newest"
python3 - "$victim" <<'EOF'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0x40
open(path, "wb").write(data)
EOF
echo "killed server 1, flipped a byte of its file of checkpoint $newest"
server server-1b 1

wait_pid "$PID_coordinator" 200
[ "$EXIT_CODE" = 0 ] || fail "coordinator exit code $EXIT_CODE"
for name in server-0 server-1b worker-0 worker-1; do
  pid_var=PID_${name//-/_}
  wait_pid "${!pid_var}" 30
  [ "$EXIT_CODE" = 0 ] || fail "$name exit code $EXIT_CODE"
done
grep -q "cannot restore shard 1 from checkpoint $newest.*CRC-32" "$WORK/server-1b.log" \
  || fail "the restarted server did not find its damaged file"
grep -q "cannot restore checkpoint $newest.*refused" "$WORK/coordinator.log" \
  || fail "the coordinator did not refuse checkpoint $newest"
grep -q "rolled back to checkpoint $previous " "$WORK/server-0.log" \
  || fail "server 0 did not roll back to checkpoint $previous"
grep -q "restored .* from checkpoint $previous " "$WORK/server-1b.log" \
  || fail "server 1 did not restore checkpoint $previous"
accuracy=$(sed -n 's/.*final test accuracy \([0-9.]*\).*/\1/p' "$WORK/coordinator.log" | tail -1)
echo "job completed after the fall-back from checkpoint $newest to $previous; final accuracy $accuracy"
python3 -c "import sys; sys.exit(0 if float('${accuracy:-0}') >= 0.7 else 1)" \
  || fail "final accuracy ${accuracy:-none} below 0.7"

# Another number of shards cannot restore per-shard files: refused at start.
EXIT_CODE=0
"$BIN/grps-coordinator" --listen=127.0.0.1:0 --servers=3 "${JOB[@]}" \
  --state_dir="$WORK/other-state" >"$WORK/reshard.log" 2>&1 || EXIT_CODE=$?
[ "$EXIT_CODE" = 2 ] || fail "a 3-server coordinator on 2-shard per-shard checkpoints exited $EXIT_CODE"
grep -q -- "--servers=2" "$WORK/reshard.log" || fail "the refusal does not name --servers=2"
echo "PASS"
