#!/usr/bin/env bash
# End to end: `grps-local --metrics_listen=HOST:PORT` does what an operator
# means. Every daemon it starts (coordinator, 2 servers, 2 workers) serves
# Prometheus metrics on a port of its own, from PORT on. grps-local prints
# each address and writes them as Prometheus file_sd targets. Each printed
# address is scraped while the job runs, and answers with that daemon's own
# metrics. (Before, grps-local accepted the flag and ignored it.) First,
# each gets what is not a scrape: another path (404), another method (405),
# bytes that are not HTTP and an oversized header (400); it must answer
# each and go on serving. (Before, prometheus-cpp's HTTP threads overflowed
# their 100 KiB stacks, 60 KiB of which OpenBLAS's thread-local storage
# takes, on any error reply: `curl http://WORKER/` killed a worker.)
set -euo pipefail
BIN=${1:?usage: e2e_local_metrics_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

# Five consecutive loopback ports nobody listens on right now.
BASE=$(free_port 5)

RUN="$WORK/run"
# Long enough to be scraped while it trains, short enough for ctest.
start local "$BIN/grps-local" --run_dir="$RUN" --steps=3000 --train_limit=6000 --test_limit=1000 \
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

# stray HOST:PORT: the status code of each request that is not a scrape.
stray() {
  python3 - "$1" <<'PY'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
codes = []
for raw in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            b"\x16\x03\x01 not http at all\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"):
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(raw)
        reply = s.recv(200).split(b" ")
        codes.append(reply[1].decode() if len(reply) > 1 else "none")
        s.close()
    except OSError as e:
        codes.append("error")
print(" ".join(codes))
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
  for ((i = 0; i < 100; i++)); do
    codes=$(stray "$address")
    [ "$codes" != "error error error error" ] && break
    sleep 0.1
  done
  [ "$codes" = "404 405 400 400" ] || fail "$daemon at $address answered $codes to stray requests"
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
