#!/usr/bin/env bash
# End to end: a real Prometheus (Debian's `prometheus`) scrapes every daemon
# of a live async job (a coordinator, 2 servers, 2 workers, each serving
# /metrics on a port the test picks), and its query API answers for what SPEC §6
# names: updates applied, the staleness histogram, step time, samples/s,
# RPC counts, bytes. Prints the queries and their answers.
set -euo pipefail
BIN=${1:?usage: e2e_prometheus_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
# 77: ctest reports the test as skipped, not passed.
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
PROMETHEUS=$(command -v prometheus || true)
[ -n "$PROMETHEUS" ] || { echo "SKIP: no prometheus (apt-get install prometheus)"; exit 77; }

# write_config: Prometheus' configuration, scraping "${targets[@]}" every 250 ms.
write_config() {
  python3 - "$WORK/prometheus.yml" "${targets[@]}" <<'PY'
import sys
path, targets = sys.argv[1], sys.argv[2:]
with open(path, "w") as f:
    f.write("global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n")
    f.write("scrape_configs:\n  - job_name: grps\n    static_configs:\n      - targets: [%s]\n"
            % ", ".join("'%s'" % t for t in targets))
PY
}

# Long enough (over a second even on a fast machine) that the samples/s
# gauge is scraped during the run, not only from its last window.
STEPS=4000
# Each daemon's metrics port, picked now, so that Prometheus knows all five
# targets before the job starts: a job of a few seconds may end before a
# reloaded configuration would be scraped.
declare -A MPORT
targets=()
for d in coordinator server-0 server-1 worker-0 worker-1; do
  MPORT[$d]=$(free_port)
  targets+=("127.0.0.1:${MPORT[$d]}")
done
PROM_PORT=$(free_port)
mkdir -p "$WORK/tsdb"
write_config
start prometheus "$PROMETHEUS" --config.file="$WORK/prometheus.yml" \
  --storage.tsdb.path="$WORK/tsdb" --web.listen-address=127.0.0.1:"$PROM_PORT" \
  --log.level=warn
API=http://127.0.0.1:$PROM_PORT/api/v1
# Prometheus listens before any daemon binds a port of its own.
for ((i = 0; i < 200; i++)); do
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
    "http://127.0.0.1:$PROM_PORT/-/ready" 2>/dev/null && break
  sleep 0.1
done

# query PROMQL: the query's result vector as JSON ("[]" until it answers).
query() {
  python3 - "$API" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
api, q = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(api + "/query?" + urllib.parse.urlencode({"query": q}),
                                timeout=5) as r:
        print(json.dumps(json.load(r)["data"]["result"]))
except Exception:
    print("[]")
PY
}
# value PROMQL: the first result's value, or "none".
value() {
  query "$1" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["value"][1] if r else "none")'
}
# wait_scraped N WHAT: until Prometheus scrapes N targets successfully.
wait_scraped() {
  local i
  for ((i = 0; i < 300; i++)); do
    [ "$(value 'count(up == 1)')" = "$1" ] && return 0
    sleep 0.1
  done
  fail "$2"
}

start coordinator "$BIN/grps-coordinator" --listen=127.0.0.1:0 --port_file="$WORK/coordinator.port" \
  --metrics_listen=127.0.0.1:"${MPORT[coordinator]}" --job_id=prom --mode=async --servers=2 \
  --workers=2 --steps=$STEPS --batch=32 --train_limit=6000 --test_limit=2000 --eval_every=500 \
  --hidden=64 --heartbeat_ms=200 --heartbeat_timeout_ms=3000 --linger_ms=3000
wait_for_file "$WORK/coordinator.port" 20
COORD=127.0.0.1:$(cat "$WORK/coordinator.port")
for s in 0 1; do
  start server-$s "$BIN/grps-server" --coordinator="$COORD" --listen=127.0.0.1:0 \
    --metrics_listen=127.0.0.1:"${MPORT[server-$s]}"
done
# The workers start once Prometheus scrapes the other three, so that the
# job is scraped from its first step.
wait_scraped 3 "prometheus does not scrape the coordinator and servers"
for w in 0 1; do
  start worker-$w "$BIN/grps-worker" --coordinator="$COORD" --backend=cpu \
    --metrics_listen=127.0.0.1:"${MPORT[worker-$w]}"
done

wait_pid "$PID_coordinator" 180
[ "$EXIT_CODE" = 0 ] || fail "coordinator exit code $EXIT_CODE"
for w in 0 1; do
  pid_var=PID_worker_$w
  wait_pid "${!pid_var}" 30
  [ "$EXIT_CODE" = 0 ] || fail "worker-$w exit code $EXIT_CODE"
done

# What Prometheus recorded of the job (its last samples, over the window).
W=10m
declare -A Q=(
  [targets_scraped]="count(max_over_time(up[$W]) == 1)"
  [updates_applied]="sum(max_over_time(grps_shard_updates_applied_total[$W]))"
  [staleness_count]="sum(max_over_time(grps_shard_staleness_count[$W]))"
  [staleness_p50]="histogram_quantile(0.5, sum by (le) (max_over_time(grps_shard_staleness_bucket[$W])))"
  [staleness_p99]="histogram_quantile(0.99, sum by (le) (max_over_time(grps_shard_staleness_bucket[$W])))"
  [staleness_mean]="sum(max_over_time(grps_shard_staleness_sum[$W])) / sum(max_over_time(grps_shard_staleness_count[$W]))"
  [worker_steps]="sum(max_over_time(grps_worker_steps_total[$W]))"
  [step_seconds_p50]="histogram_quantile(0.5, sum by (le) (max_over_time(grps_worker_step_seconds_bucket[$W])))"
  [samples_per_second_max]="max(max_over_time(grps_worker_samples_per_second[$W]))"
  [job_samples_per_second_max]="max_over_time(grps_job_samples_per_second[$W])"
  [push_calls_ok]="sum(max_over_time(grps_rpc_server_handled_total{method=\"/grps.v1.ParameterServer/Push\",code=\"OK\"}[$W]))"
  [push_p50_seconds]="histogram_quantile(0.5, sum by (le) (max_over_time(grps_rpc_server_handling_seconds_bucket{method=\"/grps.v1.ParameterServer/Push\"}[$W])))"
  [shard_received_mib]="sum(max_over_time(grps_shard_received_bytes_total[$W])) / 2^20"
  [worker_pushed_mib]="sum(max_over_time(grps_worker_pushed_bytes_total[$W])) / 2^20"
  [worker_lane_mib]="sum(max_over_time(grps_worker_lane_bytes_total[$W])) / 2^20"
  [shard_doorbell_pushes]="sum(max_over_time(grps_shard_doorbell_pushes_total[$W]))"
  [job_global_step_max]="max_over_time(grps_job_global_step[$W])"
)
declare -A V
for k in $(printf '%s\n' "${!Q[@]}" | sort); do
  V[$k]=$(value "${Q[$k]}")
  printf '%-26s %-12s %s\n' "$k" "${V[$k]}" "${Q[$k]}"
done

# ge A B: A >= B, as numbers ("none" is not a number).
ge() { python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)" 2>/dev/null; }
[ "${V[targets_scraped]}" = 5 ] || fail "not every daemon was scraped"
# The last scrape of a daemon may come a little before its last step, so
# the counts are checked for being there, not for their final values. Async:
# every applied update has a staleness in the histogram, and both come from
# the same scrapes of the same shards, so they agree exactly.
ge "${V[updates_applied]}" 1 || fail "updates applied: ${V[updates_applied]}"
[ "${V[staleness_count]}" = "${V[updates_applied]}" ] ||
  fail "staleness histogram count ${V[staleness_count]} != updates applied ${V[updates_applied]}"
ge "${V[staleness_p50]}" 0 || fail "no staleness quantile"
ge "${V[worker_steps]}" 1 || fail "worker steps: ${V[worker_steps]}"
ge "${V[step_seconds_p50]}" 0.00001 || fail "no step time"
ge "${V[samples_per_second_max]}" 1 || fail "no samples/s"
ge "${V[push_calls_ok]}" 1 || fail "push calls: ${V[push_calls_ok]}"
ge "${V[shard_received_mib]}" 0.01 || fail "no bytes received"
# Every daemon runs on this machine: the values went through lanes.
ge "${V[worker_lane_mib]}" 0.01 || fail "no bytes through shared-memory lanes"
ge "${V[shard_doorbell_pushes]}" 1 || fail "no pushes rung at lane doorbells"
ge "${V[job_global_step_max]}" 1 || fail "no global step"
echo "PASS: prometheus scraped all 5 daemons of an async job of $STEPS steps"
