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
