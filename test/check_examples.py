#!/usr/bin/env python3
"""Checks the examples grps-worker --examples_log files say were trained.

usage: check_examples.py EXAMPLES_PER_EPOCH EPOCHS LOG...

Each LOG line is "STEP EPOCH UNIX_MS I1 I2 ..." (worker/trainer.h). Every
epoch in [0, EPOCHS) must have trained exactly EXAMPLES_PER_EPOCH examples,
none of them twice, over all the logs together. Prints, per log, its steps
and the longest and median interval between two of its pushes.
"""
import statistics
import sys


def main():
    per_epoch, epochs = int(sys.argv[1]), int(sys.argv[2])
    seen = [dict() for _ in range(epochs)]
    errors = []
    for path in sys.argv[3:]:
        times = []
        for n, line in enumerate(open(path), 1):
            fields = [int(f) for f in line.split()]
            epoch, unix_ms, examples = fields[1], fields[2], fields[3:]
            times.append(unix_ms)
            if not 0 <= epoch < epochs:
                errors.append("%s:%d: epoch %d out of range" % (path, n, epoch))
                continue
            for i in examples:
                if i in seen[epoch]:
                    errors.append("epoch %d: example %d trained twice (%s and %s:%d)"
                                  % (epoch, i, seen[epoch][i], path, n))
                seen[epoch][i] = "%s:%d" % (path, n)
        gaps = [b - a for a, b in zip(times, times[1:])]
        print("%s: %d steps; longest interval between pushes %d ms, median %d ms"
              % (path, len(times), max(gaps, default=0),
                 statistics.median(gaps) if gaps else 0))
    for epoch in range(epochs):
        if len(seen[epoch]) != per_epoch:
            errors.append("epoch %d: %d distinct examples trained, not %d"
                          % (epoch, len(seen[epoch]), per_epoch))
    for e in errors[:20]:
        print("ERROR:", e)
    if errors:
        sys.exit(1)
    print("every one of the %d epochs trained its %d examples exactly once" % (epochs, per_epoch))


if __name__ == "__main__":
    main()
