"""Acceptance (sparse from PyTorch): gt.EmbeddingBag rows live in a grps
sparse table; 2 workers in sync with SGD end with the rows and head of one
PyTorch process (nn.EmbeddingBag, the whole batch) started from the same
rows. A job whose servers re-shard 2 -> 3 while they train (--max_servers)
ends with the rows and head of the undisturbed job, bit for bit: a row pull
or push that the re-sharding's roll-back ends is taken in the library. A
bag whose dim is not its table's is refused as the worker joins."""

import shutil
import tempfile
import unittest

import torch

from bag_model import reference
from harness import Job
from test_faults import global_step, scale, wait_for

STEPS = 20
LR = 0.5


class SparseFromPyTorch(unittest.TestCase):
    def check(self, mode):
        flags = ["--mode=sync", "--optimizer=sgd", "--lr=%g" % LR, "--momentum=0",
                 "--sparse_tables=t:0:4"]
        with Job(servers=2, workers=2, flags=flags) as job:
            out = job.path("rank0.pt")
            job.worker("bag_worker.py", ["--steps", str(STEPS), "--mode", mode, "--out", out],
                       rank=0)
            job.worker("bag_worker.py", ["--steps", str(STEPS), "--mode", mode], rank=1)
            for r in (0, 1):
                self.assertEqual(job.wait("worker%d" % r, 120), 0, job.logs())
            got = torch.load(out)
        rows, fc = reference(got["init"], STEPS, LR, mode)
        self.assertFalse(torch.equal(got["init"], got["final"]), "the rows trained")
        rel = (got["final"] - rows).norm() / rows.norm()
        self.assertLess(float(rel), 1e-5, "rows differ by %g relative" % rel)
        for name, want in fc.items():
            rel = (got["head"][name] - want).norm() / want.norm()
            self.assertLess(float(rel), 1e-5, name)

    def test_mean_bags(self):
        self.check("mean")

    def test_sum_bags(self):
        self.check("sum")

    def test_a_bag_of_another_dim_than_its_table_is_refused_when_the_worker_joins(self):
        flags = ["--mode=sync", "--optimizer=sgd", "--lr=%g" % LR, "--sparse_tables=t:0:4"]
        with Job(servers=1, workers=1, flags=flags) as job:
            job.worker("bag_worker.py", ["--steps", "3", "--dim", "8"], rank=0)
            self.assertEqual(job.wait("worker0", 120), 1, job.logs())
            log = job.log("worker0")
        self.assertIn("ValueError: gt.EmbeddingBag('t', 8): table 't' has rows of 4 floats "
                      "(--sparse_tables t:0:4)", log)
        # Raised by the call that joined, before any forward pass.
        self.assertIn("gt.DistributedOptimizer(", log)
        self.assertNotIn("forward", log)

    def run_paced(self, steps, reshard=False):
        """2 workers, sync, `steps` paced steps; with `reshard`, the servers
        go from 2 to 3 shards at step 40. Rank 0's saved rows and head."""
        ckpt = tempfile.mkdtemp(prefix="grps-py-ckpt.")
        try:
            flags = ["--mode=sync", "--optimizer=momentum", "--lr=%g" % LR,
                     "--sparse_tables=t:0:4", "--checkpoint_every_steps=20"]
            if reshard:
                flags.append("--max_servers=3")
            with Job(servers=2, workers=2, flags=flags, checkpoint_dir=ckpt) as job:
                out = job.path("rank0.pt")
                args = ["--steps", str(steps), "--pace_ms", "10"]
                job.worker("bag_worker.py", args + ["--out", out], rank=0)
                job.worker("bag_worker.py", args, rank=1)
                said = None
                if reshard:
                    job.start_server(2)  # the standby for shard 2
                    wait_for("step 40", lambda: global_step(job) >= 40)
                    said = scale(job, 3)
                for r in (0, 1):
                    self.assertEqual(job.wait("worker%d" % r, 120), 0, job.logs())
                self.assertEqual(job.wait("coordinator", 60), 0, job.logs())
                logs = job.logs()
                return torch.load(out), said, logs
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)

    def test_the_servers_re_shard_while_python_workers_train_rows_to_the_same_values(self):
        steps = 200
        undisturbed, _, _ = self.run_paced(steps)
        moved, said, logs = self.run_paced(steps, reshard=True)
        self.assertRegex(said, r"re-sharded from 2 to 3 shards at step \d+")
        self.assertIn("following shard map epoch", logs)
        self.assertIn("rolled back to checkpoint", logs)
        self.assertTrue(torch.equal(moved["init"], undisturbed["init"]))
        self.assertTrue(torch.equal(moved["final"], undisturbed["final"]), "the rows")
        for name, want in undisturbed["head"].items():
            self.assertTrue(torch.equal(moved["head"][name], want), name)


if __name__ == "__main__":
    unittest.main()
