#!/usr/bin/env python3
"""dlrm_capacity: the --sparse_tables of a DLRM job (examples/torch/dlrm_criteo.py)
whose shards hold a given share of the rows an unbounded run of it held
(issue 43's second acceptance: a capacity of 10 % of the distinct ids).

    /usr/bin/python3 bench/dlrm_capacity.py --share 0.1 --dim 16 \\
        --options admit_after=2 --capacity_options eviction=lfu RUN_DIR/server-*.log

Reads each server's exit lines ("shard S table T: R rows x D ...") of the
unbounded run. The share is of the rows of every table together: tables of
at most --keep_below rows in all (the small vocabularies, whose every value
is frequent) keep theirs, with no capacity; the others share what is left of
the budget in proportion to their rows, as max_rows a shard (at least 1),
with --capacity_options (the eviction policy, which needs a capacity).
Every table gets --options. Prints the flag, then (on stderr) the budget and
each capacity.
"""

import argparse
import collections
import math
import re
import sys

LINE = re.compile(r"shard (\d+) table (\S+): (\d+) rows x (\d+)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", help="the unbounded run's server logs")
    p.add_argument("--share", type=float, default=0.1, help="rows held over the unbounded run's")
    p.add_argument("--keep_below", type=int, default=20000,
                   help="tables of at most this many rows in all keep them")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--options", default="admit_after=2", help="options for every table")
    p.add_argument("--capacity_options", default="eviction=lfu",
                   help="options for the tables given a capacity (with max_rows=)")
    a = p.parse_args()
    if not 0 < a.share <= 1:
        p.error("--share must be in (0, 1]")

    rows = collections.defaultdict(dict)  # table -> shard -> rows
    for path in a.logs:
        with open(path) as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    rows[m.group(2)][int(m.group(1))] = int(m.group(3))
    if not rows:
        sys.exit("dlrm_capacity: no \"shard S table T: R rows\" line in %s" % " ".join(a.logs))
    shards = max(len(s) for s in rows.values())
    total = sum(sum(s.values()) for s in rows.values())
    budget = a.share * total
    small = {t: sum(s.values()) for t, s in rows.items() if sum(s.values()) <= a.keep_below}
    large = {t: sum(s.values()) for t, s in rows.items() if t not in small}
    left = budget - sum(small.values())
    if large and left <= 0:
        sys.exit("dlrm_capacity: the small tables alone hold %d rows, over the budget of %d"
                 % (sum(small.values()), budget))
    fraction = left / sum(large.values()) if large else 0
    order = sorted(rows, key=lambda t: (len(t), t))  # C1, C2, ..., C10, ...
    flag = []
    held = 0
    for t in order:
        options = a.options
        if t in large:
            cap = max(1, math.floor(fraction * large[t] / shards))
            held += cap * shards
            options = ":".join(o for o in ("max_rows=%d" % cap, a.capacity_options, options) if o)
            print("%s: %d rows -> %d a shard" % (t, large[t], cap), file=sys.stderr)
        else:
            held += small[t]
        flag.append("%s:0:%d%s" % (t, a.dim, ":" + options if options else ""))
    print("%d rows in the unbounded run, budget %d (%.1f %%): %d tables keep theirs (%d rows), "
          "%d share the rest at %.2f %% of theirs; at most %d rows held"
          % (total, budget, 100 * a.share, len(small), sum(small.values()), len(large),
             100 * fraction, held), file=sys.stderr)
    print(",".join(flag))


if __name__ == "__main__":
    main()
