#!/usr/bin/env bash
# The worker's training techniques, through grps-local's real daemons:
# 1. Gradient accumulation is exact: a job whose workers push the mean of 4
#    local batches of 16 ends with the weights and momentum, within float
#    rounding (1e-3 relative; 8e-5 measured), of the same job with batches
#    of 64 (final checkpoints compared by grps-checkpoint-diff --tolerance),
#    and not within it of a job with batches of 16 (so the comparison can
#    tell them apart). The same holds for the embedding model (Fashion-MNIST
#    as sparse features), whose rows' gradients are accumulated too: its
#    embedding table's rows, values and optimizer state, are compared as
#    well.
# 2. Clipping by global norm: the default job (Fashion-MNIST, MLP
#    784-256-128-10, sync, 2 servers, 2 workers, 3 epochs) with
#    --clip_norm=1 trains to 0.85, and its result counts the clipped steps
#    and the gradient norm before clipping.
# 3. Mixed precision: the default job computing in f16 trains to within 0.01
#    of f32's 0.870, though it starts at a loss scale of 2^24, where the
#    first gradients overflow f16: each is skipped, never pushed, counted in
#    the result, and computed again at half the scale.
set -euo pipefail
BIN=${1:?usage: e2e_worker_techniques_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

# local_job NAME FLAGS...: grps-local in $WORK/NAME, checkpoints in
# $WORK/NAME/ckpt; fails unless it completes.
local_job() {
  local name=$1; shift
  start "$name" "$BIN/grps-local" --run_dir="$WORK/$name" \
    --result_json="$WORK/$name/result.json" --backend=cpu --timeout_s=200 "$@"
  wait_pid "$(eval echo "\$PID_$name")" 220
  [ "$EXIT_CODE" = 0 ] || fail "grps-local ($name) exited with $EXIT_CODE"
}
final_checkpoint() { "$BIN/grps-checkpoint-diff" --newest "$WORK/$1/ckpt"; }

# check_accumulation PREFIX STEPS FLAGS...: jobs PREFIX_big (batches of 64),
# PREFIX_accumulated (4 x 16 accumulated) and PREFIX_small (STEPS plain
# batches of 16, as many steps as the others take): the accumulated job's
# final checkpoint (chunks and sparse rows) is within 1e-3 of the big one's,
# and the small one's is not.
check_accumulation() {
  local p=$1 steps=$2; shift 2
  local_job "${p}_big" "$@" --batch=64 --checkpoint_dir="$WORK/${p}_big/ckpt"
  local_job "${p}_accumulated" "$@" --batch=16 --accumulate_steps=4 \
    --checkpoint_dir="$WORK/${p}_accumulated/ckpt"
  local_job "${p}_small" "$@" --batch=16 --steps="$steps" --checkpoint_dir="$WORK/${p}_small/ckpt"
  grep -q "each step accumulates 4 batches of 16" "$WORK/${p}_accumulated/worker-0.log" \
    || fail "$p: the accumulating worker did not say it accumulates"
  local big acc
  big=$(final_checkpoint "${p}_big")
  acc=$(final_checkpoint "${p}_accumulated")
  echo "$p steps: batch 64 $("$BIN/grps-checkpoint-diff" --step "$big"), 4 x 16 accumulated $("$BIN/grps-checkpoint-diff" --step "$acc")"
  "$BIN/grps-checkpoint-diff" --tolerance 1e-3 "$big" "$acc" \
    || fail "$p: 4 accumulated batches of 16 did not train as batches of 64"
  if "$BIN/grps-checkpoint-diff" --tolerance 1e-3 "$big" "$(final_checkpoint "${p}_small")"; then
    fail "$p: batches of 16 without accumulation also passed: the comparison proves nothing"
  fi
}
check_accumulation mlp 64 --train_limit=4096 --test_limit=1000 --epochs=2 --eval_every=0 --seed=11
check_accumulation embedding 16 --model=embedding --train_limit=2048 --test_limit=500 --epochs=1 \
  --eval_every=0 --seed=12

local_job clipped --clip_norm=1
python3 - "$WORK/clipped/result.json" <<'PY' || fail "the clipped job's result is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
acc = r["final_test_accuracy"]
print(f"clip_norm 1: final test accuracy {acc:.4f}, {r['clipped_steps']} of "
      f"{2 * r['steps']} worker steps clipped, recent gradient norm {r['gradient_norm']:.3f}, "
      f"wall {r['wall_seconds']:.1f} s")
if r["exit"] != "ok" or acc is None or acc < 0.85:
    print("expected a completed job at 0.85 or better"); sys.exit(1)
if not (0 < r["clipped_steps"] <= 2 * r["steps"]) or not r["gradient_norm"] > 0:
    print("expected clipped steps and a gradient norm"); sys.exit(1)
PY
local_job f16 --compute_dtype=f16 --loss_scale=16777216
grep -q "computing in f16 (loss scale 16777216)" "$WORK/f16/worker-0.log" \
  || fail "the f16 worker did not say it computes in f16"
grep -q "overflowed at loss scale 16777216; skipped" "$WORK/f16/worker-0.log" \
  || fail "the f16 worker did not log its first overflow"
python3 - "$WORK/f16/result.json" <<'PY' || fail "the f16 job's result is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
acc = r["final_test_accuracy"]
print(f"f16 from loss scale 2^24: final test accuracy {acc:.4f} (f32: 0.870), "
      f"{r['overflow_steps']} overflows skipped, loss scale now {r['loss_scale']:.0f}, "
      f"wall {r['wall_seconds']:.1f} s")
if r["exit"] != "ok" or acc is None or acc < 0.86:
    print("expected a completed job within 0.01 of f32's 0.870"); sys.exit(1)
if r["overflow_steps"] < 2 or not (0 < r["loss_scale"] < 16777216):
    print("expected skipped overflows and a lower scale"); sys.exit(1)
PY
echo "PASS"
