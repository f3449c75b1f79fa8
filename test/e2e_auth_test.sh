#!/usr/bin/env bash
# A job that authenticates every RPC, over TLS: grps-local runs the default
# job with a CA-signed server certificate and the job's tokens (given here,
# so the test can use them); while it trains:
#   - grpsctl without a token is refused (UNAUTHENTICATED), and so is one
#     with a wrong token; the job goes on;
#   - grpsctl with the worker token may read the status but not stop the job
#     (PERMISSION_DENIED);
#   - grpsctl trusting another CA cannot connect;
#   - grpsctl with the admin token and the right CA reads the status;
# and the job completes with test accuracy >= 0.85.
set -euo pipefail
BIN=${1:?usage: e2e_auth_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
TLS=$(cd "$(dirname "$0")/testdata/tls" && pwd)

ADMIN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORKER=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
RUN=$WORK/run
GRPS_TOKEN=$ADMIN GRPS_WORKER_TOKEN=$WORKER start local "$BIN/grps-local" --run_dir="$RUN" \
  --result_json="$RUN/result.json" --backend=cpu --timeout_s=280 \
  --straggler_rank=0 --straggle_ms=2 \
  --tls_cert="$TLS/server.pem" --tls_key="$TLS/server-key.pem" --tls_ca="$TLS/ca.pem"
wait_for_file "$RUN/coordinator.port" 30
COORD=127.0.0.1:$(cat "$RUN/coordinator.port")

# ctl TOKEN CA COMMAND: grpsctl with only that token (empty: none) and CA.
ctl() {
  env -u GRPS_TOKEN -u GRPS_WORKER_TOKEN ${1:+GRPS_TOKEN=$1} \
    "$BIN/grpsctl" --coordinator="$COORD" --tls_ca="$2" "$3" 2>&1
}
expect_refused() {  # WHAT CODE OUTPUT...
  local what=$1 code=$2; shift 2
  echo "$what: $*"
  grep -q "$code" <<<"$*" || fail "$what: expected $code"
}

# The admin token reads the status once the job runs.
for ((i = 0; i < 300; i++)); do
  out=$(ctl "$ADMIN" "$TLS/ca.pem" status) && grep -q "state *running" <<<"$out" && break
  sleep 0.1
done
grep -q "state *running" <<<"$out" || fail "the admin token could not read a running job's status: $out"

out=$(ctl "" "$TLS/ca.pem" status) && fail "grpsctl without a token read the status"
expect_refused "no token" UNAUTHENTICATED "$out"
out=$(ctl "not-the-token" "$TLS/ca.pem" stop) && fail "a wrong token stopped the job"
expect_refused "wrong token" UNAUTHENTICATED "$out"
out=$(ctl "$WORKER" "$TLS/ca.pem" status) || fail "the worker token cannot read the status: $out"
out=$(ctl "$WORKER" "$TLS/ca.pem" stop) && fail "the worker token stopped the job"
expect_refused "worker token, stop" PERMISSION_DENIED "$out"
out=$(ctl "$ADMIN" "$TLS/wrong-ca.pem" status) && fail "a client trusting another CA connected"
expect_refused "wrong CA" UNAVAILABLE "$out"

wait_pid "$PID_local" 290
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
grep -q "auth: every RPC needs the job's token" "$WORK/local.log" || fail "grps-local did not say the job is authenticated"
acc=$(json 'j["final_test_accuracy"]' <"$RUN/result.json")
echo "final test accuracy with TLS and tokens: $acc"
python3 -c "import sys; sys.exit(0 if $acc >= 0.85 else 1)" || fail "accuracy $acc < 0.85"
echo "PASS"
