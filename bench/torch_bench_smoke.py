"""ctest torch_bench_smoke: bench/torch_bench.py --quick (a few steps of
every configuration, both models) exits 0 and prints its table with a
figure in every row. The figures of a smoke run mean nothing; the full run
is by hand (docs/performance.md)."""

import os
import re
import signal
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "torch_bench.py")
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
from harness import _die_with_parent  # noqa: E402 (a ctest timeout takes the bench too)

ROWS = ["(a) PyTorch, 1 process", "(b) DDP gloo, 2 processes", "(c) grps sync, lanes",
        "(c) grps sync, gRPC only", "(c) grps async, lanes", "(c) grps async, gRPC only"]
NUMBER = re.compile(r"^[0-9][0-9,]*(\.[0-9]+)?$")
TIMEOUT_S = 170  # its ctest TIMEOUT is 180; it took 75 s under CI load, past 110 once under ctest -j 2


def run_bench(args):
    """stdout, stderr and exit status; SIGTERM at the timeout (the bench then
    ends every process it started), SIGKILL 15 s later or when this process
    dies (and with the bench, what it started)."""
    proc = subprocess.Popen([sys.executable, BENCH] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError("torch_bench --quick ran past %d s\n%s\n%s" % (TIMEOUT_S, out, err))
    return out, err, proc.returncode


class TorchBenchSmoke(unittest.TestCase):
    def test_quick_run_prints_a_figure_in_every_row(self):
        out, err, rc = run_bench(["--quick"])
        self.assertEqual(rc, 0, out + err)
        rows = {}
        for line in out.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for label in ROWS:
                if cells[0].startswith(label):
                    rows[label] = cells[1:]
        self.assertEqual(sorted(rows), sorted(ROWS), out)
        for label, cells in rows.items():
            # Per model: samples/s, the ratio to (a), the ratio to DDP, the rounds.
            self.assertEqual(len(cells), 8, "%s: %s" % (label, cells))
            for model in range(2):
                rate, to_a, to_ddp, rounds = cells[4 * model:4 * model + 4]
                self.assertEqual(rounds, rate, label)  # --quick: one round
                self.assertRegex(rate, NUMBER, label)
                self.assertRegex(to_a, NUMBER, label)
                if "grps sync" in label:
                    self.assertRegex(to_ddp, NUMBER, label)


if __name__ == "__main__":
    unittest.main()
