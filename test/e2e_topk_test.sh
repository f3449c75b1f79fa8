#!/usr/bin/env bash
# Top-k sparsification with error feedback converges on the default job:
# grps-local trains the default job (Fashion-MNIST, MLP 784-256-128-10, sync,
# 2 servers, 2 workers, 3 epochs) pushing only 10 % of each chunk's gradient
# (--topk=0.1), and its final test accuracy is within 0.02 of the dense
# job's (0.870 on this data), where top-k without error feedback would lose
# the 90 % it never sends. The servers' bytes in show the pushes shrank.
set -euo pipefail
BIN=${1:?usage: e2e_topk_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }

RUN=$WORK/run
start local "$BIN/grps-local" --run_dir="$RUN" --result_json="$RUN/result.json" \
  --topk=0.1 --backend=cpu --timeout_s=240
wait_pid "$PID_local" 260
[ "$EXIT_CODE" = 0 ] || fail "grps-local exited with $EXIT_CODE"
python3 - "$RUN/result.json" <<'PY' || fail "result.json is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
acc = r["final_test_accuracy"]
print(f"top-k 0.1: final test accuracy {acc:.4f} (dense: 0.870), wall {r['wall_seconds']:.1f} s")
if r["exit"] != "ok" or acc is None or acc < 0.85:
    print("expected a completed job at 0.85 or better"); sys.exit(1)
PY
# Each server logs its bytes in at exit: "... MiB in, ... MiB out"; a sparse
# element is an index and a value, so 10 % of them is about a fifth of the
# bytes the dense job's pulls bring back out.
for s in 0 1; do
  line=$(grep "exiting (job completed)" "$RUN/server-$s.log") || fail "server $s did not log its end"
  python3 - "$line" <<'PY' || fail "server $s: pushes were not sparse: $line"
import re, sys
m = re.search(r"([0-9.]+) MiB in, ([0-9.]+) MiB out", sys.argv[1])
bytes_in, bytes_out = float(m.group(1)), float(m.group(2))
print(f"shard: {bytes_in:.1f} MiB in, {bytes_out:.1f} MiB out")
sys.exit(0 if bytes_in < 0.3 * bytes_out else 1)
PY
done
echo "PASS"
