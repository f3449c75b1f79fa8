"""Python workers in an elastic job (--max_workers): their data comes from
the job's example ledger through gt.ElasticSampler, so that a job whose
workers go 2 -> 3 -> 2 trains every example of each epoch exactly once and
ends as accurate as the job with 2 workers throughout (elastic_worker.py)."""

import collections
import os
import subprocess
import unittest

from harness import BIN, Job
from test_faults import global_step, wait_for

EPOCHS, BATCH, TRAIN = 3, 32, 4096
FLAGS = ["--mode=sync", "--epochs=%d" % EPOCHS, "--batch=%d" % BATCH]


def trained(paths):
    """(epoch, example) -> how many times, over the workers' --examples logs;
    and the steps each log trained."""
    counts, steps = collections.Counter(), []
    for path in paths:
        with open(path) as f:
            lines = [line.split() for line in f if line.strip()]
        steps.append(len(lines))
        for epoch, _, *examples in lines:
            for e in examples:
                counts[(int(epoch), int(e))] += 1
    return counts, steps


class ElasticPythonJob(unittest.TestCase):
    def run_job(self, elastic):
        flags = FLAGS + (["--max_workers=3"] if elastic else [])
        with Job(servers=2, workers=2, flags=flags) as job:
            logs = [job.path("examples-%d.log" % r) for r in range(3)]
            accuracy = job.path("accuracy")

            # Ranks 0 and 1 go slowly until rank 2 has been drained, so that
            # the job cannot end before a third worker, started late on a
            # loaded machine, has joined and trained its steps; then at
            # full speed.
            drained = job.path("drained")

            def worker(r, pace_ms):
                args = ["--epochs", str(EPOCHS), "--batch", str(BATCH), "--examples", logs[r],
                        "--pace_ms", str(pace_ms)] + (["--pace_until", drained] if r < 2 else [])
                job.worker("elastic_worker.py", args + (["--accuracy", accuracy] if r == 0
                                                        else []), rank=r)

            for r in (0, 1):
                worker(r, 50 if elastic else 0)
            if elastic:
                # A third worker joins at global step 40 and is drained once it
                # has trained 40 steps; the two go on to the end.
                wait_for("global step 40", lambda: global_step(job) >= 40)
                worker(2, 15)
                wait_for("rank 2's 40 steps", lambda: self.lines(logs[2]) >= 40, 90)
                drain = subprocess.run([os.path.join(BIN, "grpsctl"),
                                        "--coordinator=" + job.address, "drain", "2"],
                                       capture_output=True, text=True, timeout=30)
                self.assertEqual(drain.returncode, 0, drain.stderr)
                self.assertEqual(job.wait("worker2", 60), 0, job.logs())
                open(drained, "w").close()
                self.assertRegex(job.log("worker2"), r"rank 2 left the job after step \d+")
            for r in (0, 1):
                self.assertEqual(job.wait("worker%d" % r, 180), 0, job.logs())
            self.assertEqual(job.wait("coordinator", 60), 0, job.logs())
            coordinator = job.log("coordinator")
            counts, steps = trained(logs[:3 if elastic else 2])
            with open(accuracy) as f:
                return float(f.read()), counts, steps, coordinator

    @staticmethod
    def lines(path):
        if not os.path.exists(path):
            return 0
        with open(path) as f:
            return sum(1 for _ in f)

    def test_a_job_of_two_then_three_then_two_workers_trains_each_example_once(self):
        fixed_accuracy, fixed_counts, _, _ = self.run_job(elastic=False)
        accuracy, counts, steps, coordinator = self.run_job(elastic=True)
        self.assertIn("worker 2 left the job", coordinator)
        self.assertGreaterEqual(steps[2], 40, "rank 2 trained %d steps" % steps[2])
        # The ledger: each epoch's examples (4096, 128 blocks of 32) each
        # trained exactly once, over the three workers.
        want = {(epoch, e): 1 for epoch in range(EPOCHS) for e in range(TRAIN)}
        twice = [k for k, n in counts.items() if n > 1]
        missing = [k for k in want if k not in counts]
        self.assertEqual(twice, [], "trained more than once (epoch, example)")
        self.assertEqual(missing, [], "never trained (epoch, example)")
        self.assertEqual(dict(counts), want)
        self.assertEqual(sum(steps), EPOCHS * TRAIN // BATCH)
        # The fixed job trains the same examples (a DistributedSampler each)...
        self.assertEqual(dict(fixed_counts), want)
        # ... and ends as accurate.
        print("final accuracy %.4f elastic (2 -> 3 -> 2 workers; rank 2 trained %d steps), "
              "%.4f with 2 workers throughout" % (accuracy, steps[2], fixed_accuracy))
        self.assertLess(abs(accuracy - fixed_accuracy), 0.01)


if __name__ == "__main__":
    unittest.main()
