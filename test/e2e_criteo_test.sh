#!/usr/bin/env bash
# The built-in embedding model over several tables (issue 43): Criteo-shaped
# data from grps-criteo-gen, whose best AUC is known, trained by grps-local
# with --data_format=criteo: a table per field (C1..C26 and the 13 integer
# features), each pulled and pushed every step, the 27 bags side by side
# into the head.
#   1. sync and async on 100,000 examples (one epoch): the test AUC comes
#      within 0.04 of the data's best; every shard holds rows of all 27
#      tables.
#   2. The same sync job with every table capped at 1,600 rows a shard (LFU)
#      and rows admitted at their second update: trains to the end, its AUC
#      within 0.02 of the unbounded run's, the largest table within its cap
#      on every shard, its evictions and admissions counted.
set -euo pipefail
BIN=${1:?usage: e2e_criteo_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"

"$BIN/grps-criteo-gen" --train_out="$WORK/train.tsv.gz" --train_examples=100000 \
  --test_out="$WORK/test.tsv.gz" --test_examples=10000 --vocabulary='kaggle*1' \
  --informative=100 --truth_json="$WORK/truth.json" >"$WORK/gen.log" 2>&1 ||
  fail "grps-criteo-gen exited $?"
best=$(json 'j["test"]["best_auc"]' <"$WORK/truth.json")

# run NAME FLAGS...: a grps-local job in $WORK/NAME; prints its final test AUC.
run() {
  local name=$1; shift
  local dir="$WORK/$name"
  "$BIN/grps-local" --run_dir="$dir" --result_json="$dir/result.json" --backend=cpu \
    --timeout_s=200 --model=embedding --data_format=criteo --dataset="$WORK/train.tsv.gz" \
    --test_data="$WORK/test.tsv.gz" --classes=2 --embedding_dim=8 --hidden=32 \
    --optimizer=adagrad --lr=0.03 --batch=256 --epochs=1 --workers=2 --servers=2 "$@" \
    >"$WORK/$name.log" 2>&1 || fail "$name: grps-local exited $?"
  json 'j["final_test_auc"]' <"$dir/result.json"
}

# The rows a shard's log says it holds of TABLE at the end.
rows_of() {  # RUN SHARD TABLE
  grep -ho "table $3: [0-9]* rows" "$WORK/$1/server-$2.log" | awk '{print $3}'
}

declare -A auc
for mode in sync async; do
  auc[$mode]=$(run "$mode" --mode="$mode")
  echo "$mode: test AUC ${auc[$mode]}, the data's best $best"
  python3 -c "import sys; sys.exit(0 if ${auc[$mode]} >= $best - 0.04 else 1)" ||
    fail "$mode: AUC ${auc[$mode]} is more than 0.04 below the best $best"
  for s in 0 1; do
    for t in C1 C3 C26 I; do
      rows=$(rows_of "$mode" "$s" "embedding.$t")
      [ -n "$rows" ] && [ "$rows" -gt 0 ] ||
        fail "$mode: shard $s holds '${rows}' rows of embedding.$t"
    done
    tables=$(grep -c "table embedding\.[CI][0-9]*: " "$WORK/$mode/server-$s.log")
    [ "$tables" -eq 27 ] || fail "$mode: shard $s reported $tables tables, not 27"
  done
done

managed=$(run managed --mode=sync --embedding_max_rows_per_shard=1600 \
          --embedding_eviction=lfu --embedding_admit_after=2)
echo "managed (1,600 rows a table a shard, lfu, admitted at 2): test AUC $managed"
python3 -c "import sys; sys.exit(0 if $managed >= ${auc[sync]} - 0.02 else 1)" ||
  fail "managed: AUC $managed is more than 0.02 below the unbounded run's ${auc[sync]}"
for s in 0 1; do
  counts=$(table_counts "$WORK/managed/server-$s.log" embedding.C3) ||
    fail "managed: shard $s did not report embedding.C3"
  read -r rows evicted admitted <<<"$counts"
  echo "  shard $s, embedding.C3: $rows rows (unbounded: $(rows_of sync "$s" embedding.C3)), $evicted evicted, $admitted admitted"
  [ "$rows" -le 1600 ] && [ "$evicted" -gt 0 ] && [ "$admitted" -gt 0 ] ||
    fail "managed: shard $s holds $rows rows of embedding.C3, $evicted evicted, $admitted admitted"
done
echo "PASS"
