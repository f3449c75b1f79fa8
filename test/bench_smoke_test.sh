#!/usr/bin/env bash
# Short runs of the benchmarks, so that CI keeps them working; their figures
# come from full runs by hand (docs/performance.md). Each must exit 0 and
# print its table with the yardstick beside the figure:
#   - grps_wire_bench: 1 MiB through 1 and 2 shards, 50 sync steps, 1024
#     sparse rows of 16 beside the dense path of the same bytes; and its
#     across-hosts pair (--serve, --remote) with both ends on loopback;
#   - grps_train_bench: sync with 2 servers for 100 steps (it starts the real
#     daemons from BIN_DIR);
#   - bench/exit_latency: one short job;
#   - grps_step_bench: a small GEMM and a small model's step, both ways;
#   - grps_checkpoint_bench: 20,000 rows, a full checkpoint and 2 increments
#     read back to the shard's state.
set -euo pipefail
BIN=${1:?usage: bench_smoke_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

"$BIN/grps_wire_bench" --mib=1 --reps=1 --sync_steps=50 --sparse_rows=1024 --sparse_dims=16 \
  >"$WORK/wire.out" 2>&1 \
  || { cat "$WORK/wire.out"; fail "grps_wire_bench failed"; }
grep -q "bare grpc" "$WORK/wire.out" && grep -q "sync step of the default model" "$WORK/wire.out" \
  && grep -q "sparse / dense" "$WORK/wire.out" \
  || { cat "$WORK/wire.out"; fail "grps_wire_bench printed no table"; }

# The across-hosts pair on one host: the peer serves, the other measures
# against the addresses it wrote (scripts/wire-cross-host puts them on two
# namespace hosts).
start peer "$BIN/grps_wire_bench" --mib=1 --serve=127.0.0.1 --serve_file="$WORK/peer" \
  --serve_seconds=120
"$BIN/grps_wire_bench" --mib=1 --reps=1 --remote="$WORK/peer" >"$WORK/remote.out" 2>&1 \
  || { cat "$WORK/remote.out"; fail "grps_wire_bench --remote failed"; }
[ "$(grep -c '^| \(tcp\|bare grpc\|grps 2 shards\):' "$WORK/remote.out")" = 5 ] \
  || { cat "$WORK/remote.out"; fail "grps_wire_bench --remote printed no table of 5 rows"; }

"$BIN/grps_train_bench" --configs=sync:2 --steps=100 --no_accuracy --compute_seconds=0.2 \
  --timeout_s=120 --bin_dir="$BIN" --run_root="$WORK/train" >"$WORK/train.out" 2>&1 \
  || { cat "$WORK/train.out"; fail "grps_train_bench failed"; }
grep -q "yardstick" "$WORK/train.out" && grep -q "^sync 2s" "$WORK/train.out" \
  || { cat "$WORK/train.out"; fail "grps_train_bench printed no table"; }

bash "$(dirname "$0")/../bench/exit_latency" --runs 1 --bin "$BIN" --root "$WORK/exit" \
  -- --steps=20 --eval_every=0 --test_limit=1000 >"$WORK/exit.out" 2>&1 \
  || { cat "$WORK/exit.out"; fail "exit_latency failed"; }
grep -q "^worst:" "$WORK/exit.out" || { cat "$WORK/exit.out"; fail "exit_latency printed no result"; }
"$BIN/grps_step_bench" --backend=cpu --gemm=64 --models=20,8,3 --batch=4 --seconds=0.05 \
  >"$WORK/step.out" 2>&1 || { cat "$WORK/step.out"; fail "grps_step_bench failed"; }
grep -q "^gemm f32" "$WORK/step.out" && grep -q "synchronous .* pipelined .* ratio" "$WORK/step.out" \
  || { cat "$WORK/step.out"; fail "grps_step_bench printed no table"; }
"$BIN/grps_checkpoint_bench" --rows=20000 --increments=2 --dir="$WORK/ckpt" \
  >"$WORK/checkpoint.out" 2>&1 \
  || { cat "$WORK/checkpoint.out"; fail "grps_checkpoint_bench failed"; }
grep -q "^3 incremental" "$WORK/checkpoint.out" && grep -q "state: yes" "$WORK/checkpoint.out" \
  || { cat "$WORK/checkpoint.out"; fail "grps_checkpoint_bench printed no table"; }
cat "$WORK/wire.out" "$WORK/remote.out" "$WORK/train.out" "$WORK/exit.out" "$WORK/step.out" \
  "$WORK/checkpoint.out"
echo "PASS"
