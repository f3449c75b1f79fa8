"""The lookup service from Python (grps.LookupClient; docs/sparse.md,
"Serving rows to inference"): a sync job of gt.EmbeddingBag rows with
incremental checkpoints and the job's tokens; grps-server --serve on its
checkpoint folder (whether it applies increments or reads the job's last
checkpoint whole depends on when it starts: test/e2e_lookup_test.sh and
sparse_table_test check the increments). Once it serves the job's final checkpoint, a lookup reads
exactly the rows the workers ended with, and ids the job never had are
missing and zeros; a table the job lacks raises grps.Error (NOT_FOUND)."""

import os
import shutil
import tempfile
import time
import unittest

import numpy as np
import torch

import grps
from bag_model import DIM, IDS
from harness import BIN, Job

STEPS = 20


class LookupFromPython(unittest.TestCase):
    def test_a_lookup_reads_the_rows_the_job_ended_with(self):
        ckpt = tempfile.mkdtemp(prefix="grps-lookup-ckpt.")
        self.addCleanup(shutil.rmtree, ckpt, ignore_errors=True)
        tokens = (os.urandom(16).hex(), os.urandom(16).hex())
        flags = ["--mode=sync", "--optimizer=sgd", "--lr=0.5", "--momentum=0",
                 "--sparse_tables=t:0:4", "--checkpoint_every_steps=5",
                 "--checkpoint_full_every=10"]
        with Job(servers=2, workers=2, flags=flags, checkpoint_dir=ckpt, tokens=tokens) as job:
            port_file = job.path("serve.port")
            job.start("serve", [os.path.join(BIN, "grps-server"), "--serve",
                                "--checkpoint_dir=" + ckpt, "--listen=127.0.0.1:0",
                                "--port_file=" + port_file, "--serve_poll_ms=50"],
                      job.daemon_env())
            out = job.path("rank0.pt")
            # 100 ms a step: the job lasts long enough for a few checkpoints.
            pace = ["--pace_ms", "100"]
            job.worker("bag_worker.py", ["--steps", str(STEPS), "--out", out] + pace, rank=0)
            job.worker("bag_worker.py", ["--steps", str(STEPS)] + pace, rank=1)
            for r in (0, 1):
                self.assertEqual(job.wait("worker%d" % r, 120), 0, job.logs())
            for _ in range(200):
                if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                    break
                time.sleep(0.05)
            with open(port_file) as f:
                client = grps.LookupClient("127.0.0.1:" + f.read().strip(), token=tokens[1])
            status = {}
            for _ in range(400):
                status = client.status()
                if int(status["step"]) == STEPS:
                    break
                time.sleep(0.05)
            self.assertEqual(int(status["step"]), STEPS, job.logs())
            self.assertEqual([t["name"] for t in status["tables"]], ["t"])

            ids = np.arange(IDS + 10, dtype=np.int64)
            rows = client.lookup("t", ids)
            self.assertEqual(rows.shape, (IDS + 10, DIM))
            self.assertEqual(rows.dtype, np.float32)
            final = torch.load(out)["final"].numpy()
            self.assertTrue(np.array_equal(rows[:IDS], final), "the rows served differ")
            self.assertEqual(list(client.last_missing), list(range(IDS, IDS + 10)))
            self.assertFalse(rows[IDS:].any())
            self.assertEqual(client.last_checkpoint, int(status["checkpoint_id"]))
            with self.assertRaisesRegex(grps.Error, "NOT_FOUND|no sparse table 'nope'"):
                client.lookup("nope", ids)


if __name__ == "__main__":
    unittest.main()
