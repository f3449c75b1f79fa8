#!/usr/bin/env bash
# Every binary's --help lists its flags: those of its main file and those of
# the libraries it reads them from (the token and TLS flags, the job flags,
# metrics), and none of Abseil's own. (With Abseil's default it listed only
# the flags of a file named after the binary: "No flags matched".)
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
expect grps-local servers workers mode run_dir result_json
echo PASS
