#!/usr/bin/env bash
# The embedding model end to end (issue 11): grps-local runs real daemons
# whose workers pull and push rows of the sparse table "embedding" and the
# dense head's chunks.
#   1. Synthetic sparse data with a known Bayes accuracy: sync and async each
#      come within 2 points of it.
#   2. Fashion-MNIST through the sparse path (each pixel bucketed into
#      intensity ids) reaches 0.84, printed beside the dense MLP of the same
#      test run.
#   3. A libsvm file of 600 feature ids, hashed into a table of 500 rows
#      with a row limit per shard: trains, and the shards hold at most the
#      500 rows there are.
#   4. A table that manages itself (a tenth of the ids a shard, admission at
#      the second update, LFU eviction): trains to the end, the same in two
#      sync runs, within its capacity, its evictions and admissions counted.
#   5. Two classes: the final AUC in the result, the log and the curve.
set -euo pipefail
BIN=${1:?usage: e2e_sparse_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"

# run NAME FLAGS...: a grps-local job in $WORK/NAME; prints its final test
# accuracy on stdout.
run() {
  local name=$1; shift
  local dir="$WORK/$name"
  "$BIN/grps-local" --run_dir="$dir" --result_json="$dir/result.json" --backend=cpu \
    --timeout_s=200 "$@" >"$WORK/$name.log" 2>&1 || fail "$name: grps-local exited $?"
  json 'j["final_test_accuracy"]' <"$dir/result.json"
}

# The worker states the data set's Bayes accuracy (the generator knows it).
SYNTH=(--model=embedding --data_format=synthetic --classes=4 --optimizer=adagrad
       --lr=0.1 --embedding_dim=16 --hidden=none --epochs=3)
for mode in sync async; do
  acc=$(run "synthetic-$mode" --mode="$mode" "${SYNTH[@]}")
  bayes=$(grep -ho "Bayes accuracy [0-9.]*" "$WORK/synthetic-$mode/worker-0.log" |
          head -1 | awk '{print $3}')
  [ -n "$bayes" ] || fail "synthetic-$mode: the worker did not log the Bayes accuracy"
  echo "synthetic $mode: test accuracy $acc, Bayes $bayes"
  python3 -c "import sys; sys.exit(0 if $acc >= $bayes - 0.02 else 1)" ||
    fail "synthetic $mode: $acc is more than 2 points below the Bayes accuracy $bayes"
  # Each shard holds part of the table, never more than the 10,000 ids.
  for s in 0 1; do
    rows=$(grep -ho "table embedding: [0-9]* rows" "$WORK/synthetic-$mode/server-$s.log" |
           awk '{print $3}')
    [ -n "$rows" ] && [ "$rows" -gt 1000 ] && [ "$rows" -le 10000 ] ||
      fail "synthetic $mode: shard $s holds '${rows}' rows of the 10000-id table"
  done
done

DATA=/usr/share/datasets/fashion-mnist
if [ -d "$DATA" ]; then
  sparse=$(run fmnist-sparse --model=embedding)
  dense=$(run fmnist-dense)
  echo "Fashion-MNIST: embedding model (sparse) $sparse, dense MLP $dense"
  python3 -c "import sys; sys.exit(0 if $sparse >= 0.84 else 1)" ||
    fail "Fashion-MNIST through the sparse path reached $sparse, below 0.84"
else
  echo "Fashion-MNIST part skipped: $DATA missing (apt-get install dataset-fashion-mnist)"
fi

# A libsvm file: class c's examples draw most of their ids from their own
# range of 1-based ids; 600 ids hashed into 500 rows, at most 400 a shard.
python3 - "$WORK" <<'PY'
import random, sys
rng = random.Random(7)
for name, n in (("train", 6000), ("test", 1000)):
    with open(f"{sys.argv[1]}/{name}.libsvm", "w") as f:
        for _ in range(n):
            c = rng.randrange(3)
            ids = {rng.randrange(c * 200, c * 200 + 200) + 1 for _ in range(6)}
            ids |= {rng.randrange(600) + 1 for _ in range(4)}
            f.write(f"{c} " + " ".join(f"{i}:1" for i in sorted(ids)) + "\n")
PY
acc=$(run libsvm --model=embedding --data_format=libsvm --dataset="$WORK/train.libsvm" \
      --test_data="$WORK/test.libsvm" --classes=3 --embedding_rows=500 --embedding_dim=8 \
      --embedding_max_rows_per_shard=400 --hidden=16 --optimizer=adagrad --lr=0.1 --epochs=2)
echo "libsvm: test accuracy $acc"
python3 -c "import sys; sys.exit(0 if $acc >= 0.9 else 1)" || fail "libsvm: accuracy $acc"
total=0
for s in 0 1; do
  rows=$(grep -ho "table embedding: [0-9]* rows" "$WORK/libsvm/server-$s.log" | awk '{print $3}')
  [ -n "$rows" ] || fail "libsvm: shard $s did not report its table"
  total=$((total + rows))
done
grep -q "features are hashed into the table's 500 rows" "$WORK/libsvm/worker-0.log" ||
  fail "libsvm: the worker did not hash 600 features into 500 rows"
[ "$total" -le 500 ] || fail "libsvm: the shards hold $total rows of a 500-row table"

# 4. A table that manages itself: the synthetic data with skewed ids (zipf
# 1.1, 10,000 ids), each shard holding at most 500 rows (a tenth of its
# ids), rows admitted at their second update, the least often updated
# leaving. Trains to the end in sync, twice to the same loss (evictions
# depend on the updates alone), the shards never past 500 rows.
MANAGED=(--mode=sync "${SYNTH[@]}" --synthetic_zipf=1.1 --embedding_max_rows_per_shard=500
         --embedding_eviction=lfu --embedding_admit_after=2)
acc=$(run managed-1 "${MANAGED[@]}")
run managed-2 "${MANAGED[@]}" >/dev/null
loss=()
for r in 1 2; do loss+=("$(json 'j["final_test_loss"]' <"$WORK/managed-$r/result.json")"); done
echo "managed table (500 rows a shard of 5,000, lfu, admitted at 2): test accuracy $acc, loss ${loss[*]}"
[ "${loss[0]}" = "${loss[1]}" ] || fail "managed: two sync runs ended on losses ${loss[*]}"
python3 -c "import sys; sys.exit(0 if $acc >= 0.8 else 1)" || fail "managed: accuracy $acc"
for s in 0 1; do
  counts=$(table_counts "$WORK/managed-1/server-$s.log" embedding) ||
    fail "managed: shard $s did not report its table"
  read -r rows evicted admitted <<<"$counts"
  echo "  shard $s: $rows rows, $evicted evicted, $admitted admitted"
  [ "$rows" -le 500 ] && [ "$evicted" -gt 0 ] && [ "$admitted" -gt 0 ] ||
    fail "managed: shard $s holds $rows rows, $evicted evicted, $admitted admitted"
done

# 5. Two classes: the evaluator's AUC (class 1's score) in the result, the
# worker's log and its curve's last column; the test loss is the log loss.
acc=$(run binary --mode=sync "${SYNTH[@]}" --classes=2)
auc=$(json 'j["final_test_auc"]' <"$WORK/binary/result.json")
echo "two classes: test accuracy $acc, AUC $auc"
python3 -c "import sys; sys.exit(0 if 0.8 <= $auc <= 1 else 1)" || fail "binary: AUC $auc"
grep -q "final test accuracy [0-9.]* loss [0-9.]* AUC $(printf '%.4f' "$auc")" \
  "$WORK/binary/worker-"*.log || fail "binary: no worker logged the final AUC $auc"
tail -qn 1 "$WORK/binary/curve-worker-"*.csv | grep -q ',0\.[0-9]*$' ||
  fail "binary: no curve's last row has the AUC: $(tail -qn 1 "$WORK/binary/curve-worker-"*.csv)"
[ "$(json 'j["final_test_auc"]' <"$WORK/managed-1/result.json")" = None ] ||
  fail "managed (4 classes): the result has an AUC"
echo "PASS"
