#!/usr/bin/env bash
# Every binary's --help lists its flags: those of its main file and those of
# the libraries it reads them from (the token and TLS flags, the job flags,
# metrics), and none of Abseil's own. (With Abseil's default it listed only
# the flags of a file named after the binary: "No flags matched".) A flag a
# binary links in but has no use for is refused, not ignored; grps-local
# checks the job's flags before it starts anything.
set -euo pipefail
BIN=${1:?usage: help_flags_test.sh BIN_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect BINARY FLAG...: `BINARY --help` names each --FLAG.
expect() {
  local binary=$1 out flag; shift
  out=$("$BIN/$binary" --help 2>&1 || true)
  for flag in "$@"; do
    grep -qE -- "^    --$flag " <<<"$out" || { echo "$out" | head -20; fail "$binary --help does not list --$flag"; }
  done
  if grep -qE -- "^    --(flagfile|fromenv|helpfull) " <<<"$out"; then
    fail "$binary --help lists Abseil's own flags"
  fi
  grep -q "No flags matched" <<<"$out" && fail "$binary --help: No flags matched"
  echo "$binary --help: $(grep -cE '^    --' <<<"$out") flags"
}

expect grps-coordinator listen mode workers servers steps heartbeat_timeout_ms token
expect grps-server coordinator listen shard checkpoint_dir token tls_cert metrics_listen
expect grps-worker coordinator rank backend register_timeout_s worker_token
expect grpsctl coordinator json token
expect grps-local servers workers mode run_dir result_json checkpoint_storage metrics_listen entry

# refused EXIT MESSAGE BINARY ARG...: BINARY ARG... exits EXIT saying MESSAGE.
# Bounded: a grps-local that starts the job instead is stopped (SIGTERM; it
# stops what it started) and the check fails, rather than the test hanging.
refused() {
  local want=$1 message=$2 out code=0; shift 2
  out=$(timeout 20 "$BIN/$1" "${@:2}" 2>&1) || code=$?
  [ "$code" = "$want" ] || fail "$* exited $code, not $want: $out"
  grep -qF -- "$message" <<<"$out" || fail "$* did not say '$message': $out"
  echo "$*: exit $code, $(head -1 <<<"$out")"
}
refused 2 "--metrics_listen is not used by grpsctl" grpsctl --metrics_listen=127.0.0.1:9 status
refused 2 "--tls_client_auth is not used by grpsctl" grpsctl --notls_client_auth status
refused 2 "--tls_server_name is not used by grps-coordinator" grps-coordinator \
  --tls_server_name=grps
# A quota one message could not fit in: every retry of it refused, the job
# waiting at its first step for ever.
refused 1 "--grpc_memory_mib must be 0 (derived from the shard) or at least 64" grps-server \
  --coordinator=127.0.0.1:9 --grpc_memory_mib=63
# A malformed value or an unknown flag is a usage error (exit 2), on the
# command line or in a GRPS_<FLAG> variable; absl's own parser exits 1.
refused 2 "bad value for --workers" grps-local --workers=abc
refused 2 "bad value for --shard" grps-server --shard two
refused 2 "unknown flag --no_such_flag" grps-coordinator --no_such_flag=1
refused 2 "unknown flag --no_such_flag" grpsctl --no_such_flag status
GRPS_RANK=many refused 2 "GRPS_RANK=many" grps-worker --coordinator=127.0.0.1:9
# A port past 65535 is refused, not wrapped to its low 16 bits (99999 was
# 34463); port 0 is one to listen on, not to dial.
refused 2 "bad value for --listen: the port of 127.0.0.1:99999 must be 0-65535" \
  grps-coordinator --listen=127.0.0.1:99999
refused 2 "bad value for --coordinator: the port of 127.0.0.1:99999 must be 1-65535" \
  grpsctl --coordinator=127.0.0.1:99999 status
GRPS_COORDINATOR=127.0.0.1:0 refused 2 "GRPS_COORDINATOR=127.0.0.1:0: the port" grps-worker
# A token gRPC cannot send in a header: every client aborted (SIGABRT).
GRPS_TOKEN=$'abc\n' refused 2 "--token holds byte 3 of value 10 (a line end" grpsctl \
  --coordinator=127.0.0.1:9 status
GRPS_WORKER_TOKEN=$'w\r' refused 2 "--worker_token holds byte 1" grps-worker \
  --coordinator=127.0.0.1:9
# Flags that do not go together, or a bad metrics address, found as the
# daemon starts serving: usage errors too (they exited 1).
refused 2 "--tls_ca without --tls_cert" grps-coordinator --listen=127.0.0.1:0 \
  --tls_ca="$(dirname "$0")/testdata/tls/ca.pem"
refused 2 "metrics address '127.0.0.1' is not host:port" grps-server \
  --coordinator=127.0.0.1:9 --metrics_listen=127.0.0.1
WORK=$(mktemp -d /tmp/grps-flags.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
refused 2 "learning_rate must be a positive number" grps-local --lr=-1 --run_dir="$WORK/a"
refused 2 "--metrics_listen must be HOST:PORT" grps-local --metrics_listen=127.0.0.1:0 \
  --run_dir="$WORK/b"
# --entry's workers define the model: a built-in one is refused, even the
# default given by name, on the command line or in the environment.
refused 2 "--model=mlp is a model grps-worker trains" grps-local --entry=true --model mlp \
  --run_dir="$WORK/c"
GRPS_MODEL=softmax refused 2 "--model=softmax is a model grps-worker trains" grps-local \
  --entry=true --run_dir="$WORK/d"
# Without --entry the workers are grps-worker, which trains only built-in
# models: --model=user is refused (the servers would wait for good for a
# worker to define the model).
refused 2 "--model=user is the model of your own program, run as the workers with --entry" \
  grps-local --model=user --run_dir="$WORK/e"
GRPS_MODEL=user refused 2 "there is no --entry" grps-local --run_dir="$WORK/f"
for dir in a b c d e f; do
  [ ! -e "$WORK/$dir" ] || fail "grps-local started a job it refused ($dir)"
done
echo PASS
