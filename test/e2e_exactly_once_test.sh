#!/usr/bin/env bash
# Exactly-once, end to end (sync, 2 servers, 2 workers): pushes that are
# dropped, answered with a lost reply, sent twice and delayed, plus a server
# killed with SIGKILL and restarted mid-run, change nothing: the job's final
# checkpoint holds the same chunks, bit for bit (values, optimizer state,
# versions), as that of the same job run undisturbed. The network faults
# run with --local_transport=grpc (every push crosses the proxies); a third
# run kills a server while the workers ring its lane doorbells (the default
# transport), and must end the same.
#
# The proxies: each server listens on 127.0.0.1:P and registers the address
# of its grps-chaos-proxy (--advertise_address=127.0.0.1:Q), which forwards
# to P. The restarted server takes the same --listen port and address, so its
# proxy needs no change. Daemons are started by hand so that every exit
# status is checked.
set -euo pipefail
BIN=${1:?usage: e2e_exactly_once_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
[ -x "$BIN/grps-chaos-proxy" ] && [ -x "$BIN/grps-checkpoint-diff" ] \
  || fail "grps-chaos-proxy or grps-checkpoint-diff missing from $BIN"

STEPS=600
# Each worker sleeps PACE_MS after every step (it changes no value), so that
# the job lasts seconds whatever the machine's speed and the kill lands
# mid-run. (At 3 ms, on a loaded machine, the first two periodic cuts were
# passed before the shards heard of them, the retry waited 1 s, and the
# first complete checkpoint came at step 576 of 600: too late to kill.)
PACE_MS=6
EVERY=50
JOB_FLAGS=(--batch=32 --train_limit=6000 --test_limit=1000 --hidden=64 --seed=7
           --heartbeat_ms=100 --heartbeat_timeout_ms=1500)

# final_checkpoint NAME: the newest checkpoint folder of run NAME.
final_checkpoint() { ls -d "$WORK/$1"/ckpt/ckpt-* | sort | tail -n 1; }

# job NAME [proxies|kill]: runs the job with its daemons named NAME-*,
# checkpoints in $WORK/NAME/ckpt; with "proxies", every byte through gRPC,
# behind proxies, and a server kill; with "kill", the kill alone. Returns
# once every daemon exited 0.
job() {
  local name=$1 mode=${2:-} s w
  local chaos=; [ "$mode" = proxies ] && chaos=1
  local transport=shm; [ -n "$chaos" ] && transport=grpc
  mkdir -p "$WORK/$name"
  start "$name-coordinator" "$BIN/grps-coordinator" --listen=127.0.0.1:0 \
    --port_file="$WORK/$name/coordinator.port" --job_id=once --mode=sync --servers=2 \
    --workers=2 --steps=$STEPS --eval_every=500 "${JOB_FLAGS[@]}" --local_transport=$transport \
    --checkpoint_dir="$WORK/$name/ckpt" --checkpoint_every_steps=$EVERY \
    --recovery_timeout_ms=20000 --coordinator_timeout_ms=30000 --linger_ms=1000
  wait_for_file "$WORK/$name/coordinator.port" 20
  local coord=127.0.0.1:$(cat "$WORK/$name/coordinator.port")
  for s in 0 1; do
    if [ -n "$chaos" ]; then
      local port
      port=$(free_port)
      start "$name-proxy-$s" "$BIN/grps-chaos-proxy" --listen=127.0.0.1:0 \
        --backend=127.0.0.1:$port --seed=$((s + 1)) --drop_request=0.03 --drop_reply=0.03 \
        --duplicate=0.03 --max_delay_ms=3 --max_faults=300 \
        --port_file="$WORK/$name/proxy-$s.port"
      wait_for_file "$WORK/$name/proxy-$s.port" 20
      PROXIES+=("127.0.0.1:$(cat "$WORK/$name/proxy-$s.port")")
      start "$name-server-$s" "$BIN/grps-server" --coordinator="$coord" \
        --listen=127.0.0.1:$port --advertise_address="${PROXIES[$s]}" --shard=$s
    else
      start "$name-server-$s" "$BIN/grps-server" --coordinator="$coord" \
        --listen=127.0.0.1:0 --shard=$s
    fi
  done
  for w in 0 1; do
    start "$name-worker-$w" "$BIN/grps-worker" --coordinator="$coord" --rank=$w --backend=cpu \
      --straggle_ms=$PACE_MS
  done

  if [ -n "$mode" ]; then
    # The workers talk to the proxies: the shards registered their addresses.
    [ -z "$chaos" ] || wait_until "$coord" "sorted(s.get('address') for s in j.get('shards', [])) == sorted('${PROXIES[*]}'.split())" \
      20 "the shards to register the proxies' addresses"
    # The kill as soon as a streamed snapshot shows a complete checkpoint
    # passed (a status read a sample took up to 1.5 s on a loaded machine:
    # hundreds of steps). The victim's command line is read then, not
    # before: a process just started may not have exec'd yet, and its
    # cmdline is still this script's.
    local victim_var=PID_${name}_server_0 argv snapshot step_at_kill
    snapshot=$(watch_until "$coord" "j.get('last_checkpoint', {}).get('state') == 'CHECKPOINT_STATE_COMPLETE' and int(j.get('global_step', 0)) > int(j['last_checkpoint'].get('step', 0))" 60) ||
      fail "$name: timed out waiting for a complete checkpoint"
    mapfile -d '' argv <"/proc/${!victim_var}/cmdline"
    step_at_kill=$(json 'int(j.get("global_step", 0))' <<<"$snapshot")
    kill -KILL "${!victim_var}"
    wait "${!victim_var}" 2>/dev/null || true
    echo "$name: killed server 0 at global step $step_at_kill of $STEPS; restarting it"
    [ "$step_at_kill" -lt $((STEPS - EVERY)) ] || fail "$name: the kill came too late"
    start "$name-server-0-restarted" "${argv[@]}"
  fi

  local d
  for d in worker-0 worker-1 server-1 coordinator; do
    local var=PID_${name}_${d//-/_}
    wait_pid "${!var}" 120
    [ "$EXIT_CODE" = 0 ] || fail "$name: $d exited with $EXIT_CODE"
  done
  if [ -n "$mode" ]; then
    local restarted=PID_${name}_server_0_restarted
    wait_pid "${!restarted}" 60
    [ "$EXIT_CODE" = 0 ] || fail "$name: the restarted server 0 exited with $EXIT_CODE"
  fi
  if [ -n "$chaos" ]; then
    for s in 0 1; do
      local var=PID_${name}_proxy_$s
      kill -TERM "${!var}"
      wait_pid "${!var}" 10
      [ "$EXIT_CODE" = 0 ] || fail "$name: proxy $s exited with $EXIT_CODE"
    done
  else
    wait_pid "$PID_ref_server_0" 60
    [ "$EXIT_CODE" = 0 ] || fail "$name: server-0 exited with $EXIT_CODE"
  fi
}

PROXIES=()
job ref
job chaos proxies
job kill kill

# The proxies did their work.
faults=0
for s in 0 1; do
  line=$(grep '^chaos-proxy:' "$WORK/chaos-proxy-$s.log") || fail "proxy $s printed no counters"
  echo "proxy $s: $line"
  for k in dropped_requests dropped_replies duplicated; do
    n=$(sed -n "s/.* $k=\([0-9]*\).*/\1/p" <<<"$line")
    faults=$((faults + n))
  done
done
[ "$faults" -gt 0 ] || fail "the proxies injected no fault"

# The job rolled back once for the restarted server.
for name in chaos kill; do
  grep -q "rolled back to checkpoint" "$WORK/$name-server-1.log" \
    || fail "$name: the surviving shard did not roll back"
done
# The kill run's pushes were rung at the shards' lane doorbells.
for w in 0 1; do
  line=$(grep 'dense values:' "$WORK/kill-worker-$w.log") || fail "kill: worker $w reported no bytes"
  echo "kill: worker $w: ${line#*dense values: }"
  [[ "$line" =~ \ ([1-9][0-9]*)\ of\ [0-9]+\ push\ calls\ rung ]] \
    || fail "kill: worker $w rang no lane doorbell"
done

# Bit for bit the same final checkpoint, at the last step; and the comparison
# can tell apart two checkpoints that differ (the first against the final).
ref=$(final_checkpoint ref); chaos=$(final_checkpoint chaos); killed=$(final_checkpoint kill)
for c in "$ref" "$chaos" "$killed"; do
  [ "$("$BIN/grps-checkpoint-diff" --step "$c")" = "$STEPS" ] || fail "$c is not at step $STEPS"
done
"$BIN/grps-checkpoint-diff" "$ref" "$chaos" || fail "the final checkpoints differ (proxies)"
"$BIN/grps-checkpoint-diff" "$ref" "$killed" || fail "the final checkpoints differ (kill, doorbells)"
first=$(ls -d "$WORK/chaos/ckpt"/ckpt-* | sort | head -n 1)
set +e
"$BIN/grps-checkpoint-diff" "$first" "$chaos" >/dev/null 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "grps-checkpoint-diff did not tell the first checkpoint from the final one ($rc)"
echo "PASS"
