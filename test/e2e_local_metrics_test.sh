#!/usr/bin/env bash
# End to end: `grps-local --metrics_listen=HOST:PORT` does what an operator
# means. Every daemon it starts (coordinator, 2 servers, 2 workers) serves
# Prometheus metrics on a port of its own, from PORT on. grps-local prints
# each address and writes them as Prometheus file_sd targets. Each printed
# address is scraped while the job runs, and answers with that daemon's own
# metrics. (Before, grps-local accepted the flag and ignored it.)
set -euo pipefail
BIN=${1:?usage: e2e_local_metrics_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

# Five consecutive loopback ports nobody listens on right now.
BASE=$(free_port 5)

RUN="$WORK/run"
# Long enough to be scraped while it trains, short enough for ctest.
start local "$BIN/grps-local" --run_dir="$RUN" --steps=400 --train_limit=6000 --test_limit=1000 \
  --eval_every=0 --heartbeat_ms=100 --metrics_listen=127.0.0.1:"$BASE"

# scrape HOST:PORT: the metrics page, or nothing.
scrape() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen("http://%s/metrics" % sys.argv[1], timeout=2) as r:
        print(r.read().decode())
except Exception:
    pass
PY
}

wait_for_file "$RUN/prometheus-targets.json" 60
# What each daemon's page must show: its own kind of metric.
declare -A WANT=([coordinator]=grps_job_ [server-0]=grps_shard_ [server-1]=grps_shard_
                 [worker-0]=grps_worker_ [worker-1]=grps_worker_)
offset=0
for daemon in coordinator server-0 server-1 worker-0 worker-1; do
  address=127.0.0.1:$((BASE + offset))
  offset=$((offset + 1))
  grep -q "$daemon: http://$address/metrics" "$WORK/local.log" ||
    fail "grps-local did not print $daemon's metrics address $address"
  grep -q "\"$address\"" "$RUN/prometheus-targets.json" ||
    fail "prometheus-targets.json lacks $address"
  page=""
  for ((i = 0; i < 100; i++)); do
    page=$(scrape "$address")
    grep -q "^${WANT[$daemon]}" <<<"$page" && break
    kill -0 "$PID_local" 2>/dev/null || fail "the job ended before $daemon ($address) was scraped"
    sleep 0.1
  done
  grep -q "^${WANT[$daemon]}" <<<"$page" || fail "$daemon at $address serves no ${WANT[$daemon]}* metrics"
  echo "$daemon at $address: $(grep -c "^${WANT[$daemon]}" <<<"$page") ${WANT[$daemon]}* samples"
done

wait_pid "$PID_local" 240
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited $EXIT_CODE"
echo PASS
