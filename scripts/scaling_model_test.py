#!/usr/bin/python3
"""Tests of scripts/scaling-model: its formulas on figures worked by hand,
its reading of scripts/cross-host-bench's output, and its table."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.realpath(__file__)), "scaling-model")

# Lines as scripts/cross-host-bench prints them (two rounds).
BENCH = """\
round 1: compute 17.0 ms a step (1 process, 1 thread, batch 32)
round 1, 2 workers, 200mbit, ddp: 59.33 samples/s, 1.0787 s a step
round 1, 2 workers, 200mbit, grps: 51.14 samples/s, 1.2516 s a step
round 2: compute 21.2 ms a step (1 process, 1 thread, batch 32)
round 2, 2 workers, 200mbit, ddp: 60.69 samples/s, 1.0546 s a step
round 2, 2 workers, 200mbit, grps: 52.03 samples/s, 1.2300 s a step
"""


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=60)


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.bench = os.path.join(self.dir.name, "bench.txt")
        with open(self.bench, "w") as f:
            f.write(BENCH)

    def tearDown(self):
        self.dir.cleanup()

    def row(self, out, job):
        lines = [l for l in out.splitlines() if l.startswith("| 2 |") and job in l]
        self.assertEqual(len(lines), 1, out)
        return [c.strip() for c in lines[0].strip("|").split("|")]

    def test_each_job_is_its_best_round_against_the_formulas(self):
        r = run("--check", self.bench, "--compute_from_check")
        self.assertEqual(r.returncode, 0, r.stderr)
        # The best compute of the rounds (17.0 ms) and of the steps.
        self.assertIn("compute 17.0 ms", r.stdout)
        ddp = self.row(r.stdout, "DDP")
        grps = self.row(r.stdout, "grps sync")
        self.assertEqual(ddp[4], "1.055")
        self.assertEqual(grps[4], "1.230")
        # Ring: 17 ms + B / (0.95 R) + 2 rounds of 50 us, B = 23.3 MB, R = 25 MB/s.
        ring = 0.017 + 23.3e6 / (0.95 * 25e6) + 2 * 50e-6
        self.assertEqual(ddp[5], "%.3f" % ring)
        # grps: 17 ms + B / (0.89 R) + two parts of 256 KiB at the same rate.
        g = 0.017 + 23.3e6 / (0.89 * 25e6) + 2 * 262144 / (0.89 * 25e6)
        self.assertEqual(grps[5], "%.3f" % g)
        self.assertEqual(grps[6], "%.2f" % (g / 1.230))
        self.assertIn("Largest difference: %.0f %%" % (100 * abs(g / 1.230 - 1)), r.stdout)

    def test_a_server_link_carrying_more_than_a_worker_s_takes_longer(self):
        r = run("--check", self.bench, "--compute_from_check", "--servers=1")
        grps = self.row(r.stdout, "grps sync")
        self.assertEqual(grps[1], "1")
        g = 0.017 + 2 * 23.3e6 / (0.89 * 25e6) + 2 * 262144 / (0.89 * 25e6)
        self.assertEqual(grps[5], "%.3f" % g)

    def test_only_the_rounds_at_the_model_s_delay_are_read(self):
        # cross-host-bench --delay_ms=0,2 names each job's delay; the 2 ms
        # rows (much slower here) are another regime, not a worse round.
        with open(self.bench, "w") as f:
            f.write(BENCH.replace("200mbit, ", "200mbit, 0 ms, ") +
                    "round 1, 2 workers, 200mbit, 2 ms, grps: 10.00 samples/s, 0.5000 s a step\n"
                    "round 1, 2 workers, 200mbit, 2 ms, ddp: 10.00 samples/s, 0.4000 s a step\n")
        r = run("--check", self.bench, "--compute_from_check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.row(r.stdout, "grps sync")[4], "1.230")
        self.assertEqual(self.row(r.stdout, "DDP")[4], "1.055")
        r = run("--check", self.bench, "--delay_ms=2")
        self.assertEqual(self.row(r.stdout, "grps sync")[4], "0.500")

    def test_output_without_rounds_is_refused(self):
        with open(self.bench, "w") as f:
            f.write("nothing measured\n")
        r = run("--check", self.bench)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no 'round", r.stderr)


class TableTest(unittest.TestCase):
    def test_a_row_per_worker_count_and_a_cell_per_rate(self):
        r = run("--workers=8,512", "--rates=1gbit,100gbit")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [l for l in r.stdout.splitlines() if l.startswith(("| 8 |", "| 512 |"))]
        self.assertEqual(len(rows), 2, r.stdout)
        for line in rows:
            self.assertEqual(line.count("/"), 4, line)

    def test_bandwidth_bound_grps_leads_by_what_the_bytes_allow(self):
        # No compute, no delay, no message cost, the same link share: the
        # ratio is the ring's 2(N-1)/N over grps's 1, less grps's two parts.
        r = run("--workers=8", "--rates=1gbit", "--compute_ms=0", "--message_us=0",
                "--ring_message_us=0", "--grps_eff=0.95", "--part_kb=0.001")
        cell = [l for l in r.stdout.splitlines() if l.startswith("| 8 |")][0]
        ratio = float(cell.split("/")[2].split()[0])
        self.assertAlmostEqual(ratio, 2 * 7 / 8, places=2)

    def test_a_step_bound_by_grpc_work_is_marked(self):
        r = run("--workers=8", "--rates=100gbit", "--cpu_ns_per_byte=100")
        self.assertIn("(CPU)", [l for l in r.stdout.splitlines() if l.startswith("| 8 |")][0])
        r = run("--workers=8", "--rates=1gbit")
        self.assertNotIn("(CPU)", [l for l in r.stdout.splitlines() if l.startswith("| 8 |")][0])


if __name__ == "__main__":
    unittest.main()
