#!/usr/bin/env bash
# The lookup service (issue 43; docs/sparse.md, "Serving rows to
# inference"): grps-server --serve follows a training job's checkpoints and
# answers batched lookups of its sparse rows, fresh within seconds.
#   1. A sync job of the embedding model on synthetic data (2 servers, 2
#      workers, grps-local with its generated tokens) checkpoints every 100
#      steps, incrementally (--checkpoint_full_every=20); a lookup service
#      on its checkpoint folder, with
#      the job's tokens and a metrics port, started first: a lookup is
#      UNAVAILABLE until a checkpoint is served.
#   2. While the job trains, grps_lookup_bench watches the service: it must
#      serve at least 2 new checkpoints, with the probed rows changing, and
#      says how long after the one before was asked for each was served (a
#      row changed after that ask is read within that); the service applies increments,
#      not whole states, after the first. Then 2,000 lookups of 1,000 ids
#      with the worker token: none fails, p99 and rows/s printed.
#   3. Without a token a lookup is refused (UNAUTHENTICATED).
#   4. After the job: the service serves the job's newest checkpoint; its
#      metrics say so and count the lookups; SIGTERM ends it with exit 0.
set -euo pipefail
BIN=${1:?usage: e2e_lookup_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"

RUN=$WORK/run
CKPT=$WORK/ckpt
mkdir -p "$CKPT"
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
WORKER_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export GRPS_TOKEN=$TOKEN GRPS_WORKER_TOKEN=$WORKER_TOKEN

# 1. The service first, on the job's empty checkpoint folder: nothing
# served.
PORT=$(free_port 2)
ADDRESS=127.0.0.1:$PORT
METRICS=127.0.0.1:$((PORT + 1))
start serve "$BIN/grps-server" --serve --checkpoint_dir="$CKPT" --listen="$ADDRESS" \
  --metrics_listen="$METRICS" --serve_poll_ms=100
for ((i = 0; i < 100; i++)); do
  out=$(env -u GRPS_TOKEN "$BIN/grps_lookup_bench" --address="$ADDRESS" --lookups=1 \
        --wait_s=0 2>&1 || true)
  grep -q "UNAVAILABLE: .*no checkpoint served yet" <<<"$out" && break
  sleep 0.1
done
grep -q "UNAVAILABLE: .*no checkpoint served yet" <<<"$out" ||
  fail "a lookup before any checkpoint was not UNAVAILABLE: $out"

start local "$BIN/grps-local" --run_dir="$RUN" --result_json="$RUN/result.json" \
  --mode=sync --servers=2 --workers=2 --steps=1500 --model=embedding \
  --data_format=synthetic --classes=4 --optimizer=adagrad --lr=0.1 --embedding_dim=16 \
  --hidden=none --batch=32 --eval_every=0 --backend=cpu --heartbeat_ms=100 \
  --checkpoint_dir="$CKPT" --checkpoint_every_steps=100 --checkpoint_full_every=20 \
  --straggler_rank=0 --straggle_ms=4 --timeout_s=200

# 2. Fresh rows while the job trains, then the load.
env -u GRPS_TOKEN "$BIN/grps_lookup_bench" --address="$ADDRESS" --watch_s=5 \
  --lookups=2000 --batch=1000 --id_range=10000 --json >"$WORK/bench.out" 2>&1 ||
  fail "grps_lookup_bench failed: $(tail -n 5 "$WORK/bench.out")"
cat "$WORK/bench.out"
figures=$(tail -n 1 "$WORK/bench.out")
watched=$(json 'j["checkpoints_watched"]' <<<"$figures")
wait_s=$(json 'j["longest_wait_s"]' <<<"$figures")
changed=$(json 'j["probes_changed"]' <<<"$figures")
[ "$watched" -ge 2 ] || fail "the service served $watched new checkpoints in 5 s of training"
# The 5 s of issue 43 is a figure of the benchmark, run by hand on a quiet
# machine (docs/sparse.md); here only a service that stopped following.
python3 -c "import sys; sys.exit(0 if $wait_s <= 30 else 1)" ||
  fail "a change waited $wait_s s to be served"
[ "$changed" -ge 1 ] || fail "the probed rows never changed between checkpoints"
[ "$(json 'j["failed"]' <<<"$figures")" = 0 ] || fail "lookups failed"
grep -q "increments applied" "$WORK/serve.log" || fail "the service logged no checkpoint served"

# 3. No token: refused.
out=$(env -u GRPS_TOKEN -u GRPS_WORKER_TOKEN "$BIN/grps_lookup_bench" --address="$ADDRESS" \
      --lookups=1 --wait_s=0 2>&1 || true)
grep -q "UNAUTHENTICATED" <<<"$out" || fail "a lookup without a token was not refused: $out"

# 4. The job's newest checkpoint served at the end; metrics; SIGTERM.
wait_pid "$PID_local" 200
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
newest=$("$BIN/grps-checkpoint-diff" --newest "$CKPT")
newest_id=$((10#${newest##*ckpt-}))
served=0
for ((i = 0; i < 100; i++)); do
  served=$(curl -s "http://$METRICS/metrics" | sed -n 's/^grps_lookup_checkpoint_id \([0-9.e+]*\)$/\1/p')
  [ -n "$served" ] && [ "$(printf '%.0f' "$served")" = "$newest_id" ] && break
  sleep 0.1
done
[ -n "$served" ] && [ "$(printf '%.0f' "$served")" = "$newest_id" ] ||
  fail "the service serves checkpoint ${served:-none}, not the job's newest, $newest_id"
whole=$(curl -s "http://$METRICS/metrics" |
        sed -n 's/^grps_lookup_shard_reads_total{how="whole"} \([0-9.e+]*\)$/\1/p')
applied=$(curl -s "http://$METRICS/metrics" |
          sed -n 's/^grps_lookup_shard_reads_total{how="increment"} \([0-9.e+]*\)$/\1/p')
lookups=$(curl -s "http://$METRICS/metrics" | sed -n 's/^grps_lookup_lookups_total \([0-9.e+]*\)$/\1/p')
echo "served checkpoint $newest_id; shard files read whole $whole, increments applied $applied; lookups $lookups"
[ "$(printf '%.0f' "${applied:-0}")" -gt 0 ] || fail "no increment was applied"
[ "$(printf '%.0f' "${lookups:-0}")" -ge 2000 ] || fail "the metrics count $lookups lookups"
kill -TERM "$PID_serve"
wait_pid "$PID_serve" 20
[ "$EXIT_CODE" = 0 ] || fail "grps-server --serve exited with $EXIT_CODE on SIGTERM"
grep -q "lookup service exiting" "$WORK/serve.log" || fail "no last word from the service"
echo PASS
