"""Acceptance (sparse from PyTorch): gt.EmbeddingBag rows live in a grps
sparse table; 2 workers in sync with SGD end with the rows and head of one
PyTorch process (nn.EmbeddingBag, the whole batch) started from the same
rows."""

import unittest

import torch

from bag_model import reference
from harness import Job

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


if __name__ == "__main__":
    unittest.main()
