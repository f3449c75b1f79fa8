# Shared helpers for the end-to-end tests: start daemons we own, wait for
# them, and always tear them down (by PID, never by name).
# Usage: source test/lib.sh; set BIN to the folder with the binaries.

PIDS=()
WORK=$(mktemp -d /tmp/grps-e2e.XXXXXX)

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP_WORK:-0}" = 1 ]; then echo "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    echo "---- tail of $(basename "$f")" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# start NAME CMD...: runs CMD in the background, logging to $WORK/NAME.log.
start() {
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_${name//-/_}=$!"
}

# wait_for_file PATH SECONDS
wait_for_file() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  fail "timed out waiting for $1"
}

# wait_for_line FILE PATTERN SECONDS: waits until FILE has a line matching
# PATTERN (grep's basic regular expression).
wait_for_line() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "timed out waiting for \"$2\" in $1"
}

# wait_pid PID SECONDS: waits for one of our children to exit and sets
# EXIT_CODE to its exit status, or to "timeout". (Not in a subshell: only
# this shell can wait for its children.)
wait_pid() {
  local pid=$1 limit=$2 i
  EXIT_CODE=timeout
  for ((i = 0; i < limit * 10; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      EXIT_CODE=0
      wait "$pid" || EXIT_CODE=$?
      return 0
    fi
    sleep 0.1
  done
}

# json EXPR < file: evaluates a Python expression over the parsed JSON `j`.
json() {
  python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"
}

# status RUN_DIR: grpsctl status --json of the job grps-local runs in RUN_DIR
# (with the token grps-local generated for the job, when there is one).
status() {
  GRPS_TOKEN=$(cat "$1/token" 2>/dev/null || true) \
    "$BIN/grpsctl" --coordinator=127.0.0.1:"$(cat "$1/coordinator.port" 2>/dev/null)" --json status 2>/dev/null
}

# global_step RUN_DIR: the job's global step, or -1.
global_step() {
  status "$1" | json 'int(j.get("global_step", 0))' 2>/dev/null || echo -1
}

# child_pid PARENT_PID PATTERN: the PID of a child of PARENT_PID (one of
# grps-local's daemons) whose command line matches PATTERN.
child_pid() {
  local pid
  for pid in $(pgrep -P "$1"); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"; then
      echo "$pid"; return 0
    fi
  done
  return 1
}

# free_port [COUNT]: the first of COUNT (default 1) consecutive loopback
# ports nobody listens on right now, below the kernel's ephemeral range: a
# daemon that binds port 0 later cannot be handed one of them (a port the
# kernel picked, released and then handed out again once took Prometheus's
# port in e2e_prometheus_test).
free_port() {
  python3 - "${1:-1}" <<'PY'
import random, socket, sys
count = int(sys.argv[1])
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    low = int(f.read().split()[0])
for _ in range(1000):
    base = random.randrange(10000, max(10001, low - count))
    socks = []
    try:
        for port in range(base, base + count):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        print(base)
        break
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
else:
    sys.exit("no free loopback port below the ephemeral range")
PY
}

# field_at COORD EXPR DEFAULT: a Python expression over `grpsctl status
# --json` of the coordinator at COORD (as `j`), or DEFAULT when it does not
# answer.
field_at() {
  "$BIN/grpsctl" --coordinator="$1" --json status 2>/dev/null | json "$2" 2>/dev/null || echo "$3"
}

# wait_until COORD EXPR SECONDS WHAT: until EXPR over the status is True.
wait_until() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    [ "$(field_at "$1" "$2" False)" = True ] && return 0
    sleep 0.1
  done
  fail "timed out waiting for $4"
}

# table_counts SERVER_LOG TABLE: "ROWS EVICTED ADMITTED" of TABLE from the
# shard's exit line ("table T: R rows x D ... E rows evicted, A admitted");
# returns 1 when the log has no such line.
table_counts() {
  local line
  line=$(grep -ho "table $2: [0-9]* rows.*" "$1") || return 1
  sed -E 's/table [^:]*: ([0-9]+) rows.* ([0-9]+) rows evicted, ([0-9]+) admitted.*/\1 \2 \3/' <<<"$line"
}

# ---- Jobs grps-local runs in a RUN_DIR ----

# now_ms: wall clock in milliseconds.
now_ms() { date +%s%3N; }

# wait_until_step RUN_DIR STEP SECONDS
wait_until_step() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    [ -f "$1/coordinator.port" ] && [ "$(global_step "$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "global step never reached $2 in $1"
}

# measure_stall RUN_DIR MS: watches the global step for MS milliseconds and
# prints the longest time (ms) it stood still while training went on (a job
# that has trained all its steps, or whose workers all finished, stands
# still by right: the watch ends there). Status figures reach the
# coordinator in heartbeats, so a gap is measured to within about one
# heartbeat interval. One `grpsctl watch` streams the snapshots (every
# 20 ms): a grpsctl and a python3 started for each sample took 0.4-1 s on
# a loaded machine, longer than the stalls measured.
measure_stall() {
  GRPS_TOKEN=$(cat "$1/token" 2>/dev/null || true) python3 - "$BIN/grpsctl" \
    "127.0.0.1:$(cat "$1/coordinator.port")" "$2" <<'PY'
import json, subprocess, sys, threading, time
ctl, coordinator, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]) / 1000
watch = subprocess.Popen([ctl, f"--coordinator={coordinator}", "--json", "--interval_ms=20",
                          "watch"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
guard = threading.Timer(limit + 10, watch.kill)  # a watch that hangs ends too
guard.start()
start = last_change = now = time.monotonic()
last_step, longest, seen = None, 0.0, 0
try:
    while now - start < limit:
        line = watch.stdout.readline()
        if not line:
            break
        now = time.monotonic()
        j = json.loads(line)
        seen += 1
        if j["state"] != "JOB_STATE_RUNNING" or any(
                w["state"] == "MEMBER_STATE_FINISHED" for w in j.get("workers", [])):
            now = last_change  # training is over
            break
        step = int(j.get("global_step", 0))
        if step != last_step:
            if last_step is not None:
                longest = max(longest, now - last_change)
            last_change, last_step = now, step
finally:
    guard.cancel()
    watch.kill()
if not seen:
    sys.exit("measure_stall: grpsctl watch gave no status")
print(round(max(longest, now - last_change) * 1000))
PY
}

# wait_worker_state RUN_DIR RANK STATE SECONDS
wait_worker_state() {
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    if status "$1" | json "[w['state'] for w in j['workers'] if w['rank'] == $2][0]" 2>/dev/null \
         | grep -q "$3"; then return 0; fi
    sleep 0.1
  done
  fail "worker $2 never became $3"
}

# watch_until COORD EXPR SECONDS: streams `grpsctl watch` of the coordinator
# at COORD (every 20 ms; $GRPS_TOKEN, when set, is its token) until EXPR, a
# Python expression over a snapshot `j`, is True; prints that snapshot (one
# line of JSON) and returns 0, or returns 1 after SECONDS. For a trigger
# that must land while the job still runs: a status read per sample
# (`wait_until`, `wait_until_step`) took 0.4-1.5 s on a loaded machine, in
# which a job paced at a few ms a step runs hundreds of steps past it.
watch_until() {
  python3 - "$BIN/grpsctl" "$1" "$2" "$3" <<'PY'
import json, subprocess, sys, threading, time
ctl, coordinator, expr, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    # A watch ends when the coordinator is not up yet (or is gone): again.
    watch = subprocess.Popen([ctl, f"--coordinator={coordinator}", "--json", "--interval_ms=20",
                              "watch"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    guard = threading.Timer(max(0.0, deadline - time.monotonic()), watch.kill)
    guard.start()
    try:
        for line in watch.stdout:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if eval(expr, {"j": j}):
                print(line.strip())
                sys.exit(0)
    finally:
        guard.cancel()
        watch.kill()
        watch.wait()
    time.sleep(0.1)
sys.exit(1)
PY
}

# watch_run_until RUN_DIR EXPR SECONDS: watch_until on the coordinator of a
# grps-local run (RUN_DIR/coordinator.port, with the run's token if any).
watch_run_until() {
  GRPS_TOKEN=$(cat "$1/token" 2>/dev/null || true) watch_until \
    "127.0.0.1:$(cat "$1/coordinator.port")" "$2" "$3"
}
