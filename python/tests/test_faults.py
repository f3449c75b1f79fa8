"""Acceptance: faults with Python workers and real daemons. A worker killed
-9: the job goes on; started again for its rank it rejoins at its step. A
server killed -9 and started again: the job rolls back to the newest
checkpoint, and in sync the final weights equal the undisturbed run's, bit
for bit. A worker sent SIGTERM, and one drained by grpsctl, leave after
their step: out of the live set at once (never declared dead), and the job
completes without them. A job whose servers scale (--max_servers) is
re-sharded 2 -> 3 -> 1 while the Python workers train: they follow each new
map, and in sync the final weights equal the undisturbed run's, bit for
bit. A worker killed -9 in a sync job with checkpoints, whose program runs
its whole loop again when started for its rank, stops at the job's last
step: both shards end there, no checkpoint fails after the restart, and
the final checkpoint completes."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import torch

import grps.torch as gt
from harness import BIN, Job

STEPS = 120
FLAGS = ["--mode=sync", "--optimizer=momentum", "--lr=0.05"]


def wait_for(what, predicate, seconds=60):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def global_step(job):
    return int(job.status().get("global_step", 0))


def scale(job, servers):
    """grpsctl scale --servers=N --wait: "re-sharded from ... at step S ..."."""
    done = subprocess.run([os.path.join(BIN, "grpsctl"), "--coordinator=" + job.address, "scale",
                           "--servers=%d" % servers, "--wait", "--wait_s=60"],
                          capture_output=True, text=True, timeout=90)
    if done.returncode != 0:
        raise AssertionError("grpsctl scale --servers=%d: %s%s\n%s" % (
            servers, done.stdout, done.stderr, job.logs()))
    return done.stdout.strip()


SHARD_EXIT = re.compile(r"shard (\d+) exiting \(.*?\): version (\d+)")


class Faults(unittest.TestCase):
    def run_job(self, fault=None, steps=STEPS, extra_flags=(), pace_ms=20):
        ckpt = tempfile.mkdtemp(prefix="grps-py-ckpt.")
        try:
            flags = FLAGS + ["--checkpoint_every_steps=20"] + list(extra_flags)
            with Job(servers=2, workers=2, flags=flags, checkpoint_dir=ckpt) as job:
                out = job.path("rank0.pt")
                args = ["--steps", str(steps), "--pace_ms", str(pace_ms)]
                job.worker("odd_cnn_worker.py", args + ["--out", out], rank=0)
                job.worker("odd_cnn_worker.py", args, rank=1)
                if fault:
                    fault(job, args)
                self.assertEqual(job.wait("worker0", 180), 0, job.logs())
                for name in list(job.procs):
                    if name.startswith("worker1"):
                        code = job.procs[name].poll() if name == "worker1" else job.wait(name, 60)
                        if name != "worker1":
                            self.assertEqual(code, 0, job.logs())
                self.assertEqual(job.wait("coordinator", 60), 0, job.logs())
                self.assertIn("completed", job.log("coordinator"))
                # Every shard the job ended with made its steps, none more.
                ended = [int(m.group(2)) for n in job.procs if n.startswith("server")
                         for m in SHARD_EXIT.finditer(job.log(n))
                         if "(job completed)" in m.group(0)]
                self.assertTrue(ended, job.logs())
                self.assertEqual(set(ended), {steps}, job.logs())
                final = torch.load(out)["__model__"]
                # The job's final checkpoint holds the model's parameters by name.
                saved = gt.state_dict(checkpoint=ckpt)
                trained = {n for n in final if n not in ("frozen.weight", "frozen.bias")}
                self.assertEqual(set(saved), trained)
                for name, values in saved.items():
                    self.assertTrue(torch.equal(values, final[name]), name)
                return final, {n: job.log(n) for n in job.procs}
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)

    def test_a_worker_sent_sigterm_or_drained_leaves_after_its_step(self):
        with Job(servers=2, workers=3, flags=FLAGS) as job:
            args = ["--steps", "400", "--pace_ms", "10"]
            for r in range(3):
                job.worker("odd_cnn_worker.py", args, rank=r)
            wait_for("step 20", lambda: global_step(job) >= 20)
            job.procs["worker2"].send_signal(signal.SIGTERM)
            self.assertEqual(job.wait("worker2", 30), 0, job.logs())
            self.assertRegex(job.log("worker2"), r"rank 2 left the job after step \d+")
            drain = subprocess.run([os.path.join(BIN, "grpsctl"), "--coordinator=" + job.address,
                                    "drain", "1"], capture_output=True, text=True, timeout=30)
            self.assertEqual(drain.returncode, 0, drain.stderr)
            self.assertEqual(job.wait("worker1", 30), 0, job.logs())
            self.assertRegex(job.log("worker1"), r"rank 1 left the job after step \d+")
            workers = {w["rank"]: w for w in job.status()["workers"]}
            self.assertEqual(workers[1]["state"], "MEMBER_STATE_LEFT")
            self.assertEqual(workers[2]["state"], "MEMBER_STATE_LEFT")
            # Rank 0 trains on alone, and the job completes.
            self.assertEqual(job.wait("worker0", 180), 0, job.logs())
            self.assertEqual(job.wait("coordinator", 60), 0, job.logs())
            log = job.log("coordinator")
            self.assertRegex(log, r"worker 2 left the job after step \d+ \(on its own\)")
            self.assertRegex(log, r"worker 1 left the job after step \d+ \(drained\)")
            self.assertIn("workers 1, 2 left before finishing", log)
            self.assertNotIn("missed its heartbeats", log)

    def test_a_killed_worker_started_again_rejoins_at_its_step(self):
        def kill_and_restart(job, args):
            wait_for("step 30", lambda: global_step(job) >= 30)
            job.kill("worker1")
            killed_at = global_step(job)
            # The job goes on without it, and it comes back for its rank.
            wait_for("steps without worker 1", lambda: global_step(job) >= killed_at + 10)
            self.assertLess(global_step(job), 250, "the job is still running")
            job.worker("odd_cnn_worker.py", args, rank=1, name="worker1-again")
            self.assertEqual(job.wait("worker1-again", 120), 0, job.logs())
            log = job.log("worker1-again")
            self.assertIn("registered as rank 1", log)
            self.assertRegex(log, r"resuming at step [1-9]\d*", "it rejoins at its step")
        self.run_job(kill_and_restart, steps=400)

    def test_a_restarted_rank_stops_at_the_jobs_last_step_whatever_its_loop_does(self):
        steps = 300
        ckpt = tempfile.mkdtemp(prefix="grps-py-ckpt.")
        flags = FLAGS + ["--steps=%d" % steps, "--checkpoint_every_steps=50"]
        try:
            with Job(servers=2, workers=2, flags=flags, checkpoint_dir=ckpt) as job:
                args = ["--steps", str(steps), "--pace_ms", "30"]
                for r in range(2):
                    job.worker("own_loop_worker.py", args, rank=r)
                wait_for("step 40", lambda: global_step(job) >= 40)
                job.kill("worker1")
                killed_at = global_step(job)
                # The fault landed: killed by the signal, mid-job.
                self.assertEqual(job.procs["worker1"].returncode, -signal.SIGKILL)
                self.assertLess(killed_at, steps - 100, "the kill came too late")
                mark = len(job.log("coordinator"))
                job.worker("own_loop_worker.py", args, rank=1, name="worker1-again")
                for name in ("worker0", "worker1-again", "coordinator"):
                    self.assertEqual(job.wait(name, 120), 0, job.logs())
                again = job.log("worker1-again")
                started = re.search(r"START at step (\d+)", again)
                self.assertIsNotNone(started, again)
                self.assertLess(int(started.group(1)), steps, "it rejoined before the end")
                self.assertIn("ENDED at step %d: " % steps, again)
                versions = {}
                for s in range(2):
                    for m in SHARD_EXIT.finditer(job.log("server%d" % s)):
                        versions[int(m.group(1))] = int(m.group(2))
                self.assertEqual(versions, {0: steps, 1: steps}, job.logs())
                coordinator = job.log("coordinator")
                # No cut at the job's end fails: no rank runs past it. (A cut
                # that the shards pass in a burst of steps after a stall, the
                # coordinator's rate estimate, is not this test's subject.)
                self.assertNotRegex(coordinator[mark:],
                                    r"checkpoint \d+ failed: .* past the checkpoint's %d\b"
                                    % steps)
                final = re.search(r"checkpoint (\d+) \(final\) asked", coordinator)
                self.assertIsNotNone(final, coordinator[-3000:])
                self.assertRegex(coordinator, r"checkpoint %s complete at step %d:"
                                 % (final.group(1), steps))
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)

    def test_a_killed_server_rolls_back_to_the_same_weights_in_sync(self):
        undisturbed, _ = self.run_job()

        def kill_server(job, args):
            wait_for("step 50", lambda: global_step(job) >= 50)
            # A checkpoint to roll back to (on a loaded machine the first may
            # complete after step 50).
            wait_for("a checkpoint", lambda: int(job.status().get("checkpoints_completed", 0)) > 0)
            job.kill("server0")
            job.start_server(0)
        restored, logs = self.run_job(kill_server)
        self.assertIn("rolled back to checkpoint", logs["worker0"] + logs["worker1"])
        for name, want in undisturbed.items():
            self.assertTrue(torch.equal(restored[name], want), name)

    def test_the_servers_re_shard_2_3_1_while_python_workers_train_to_the_same_weights(self):
        # Long enough for two moves, each cut some steps ahead.
        steps = 300
        undisturbed, _ = self.run_job(steps=steps, pace_ms=10)
        said = []

        def reshard(job, args):
            job.start_server(2)  # a standby for shard 2, as a StatefulSet's new pod
            wait_for("step 40", lambda: global_step(job) >= 40)
            said.append(scale(job, 3))
            self.assertEqual(len(job.status()["shards"]), 3)
            wait_for("step 140", lambda: global_step(job) >= 140)
            said.append(scale(job, 1))
            self.assertEqual(len(job.status()["shards"]), 1)
            for s in (1, 2):
                self.assertEqual(job.wait("server%d" % s, 30), 0, job.logs())
        moved, logs = self.run_job(reshard, steps=steps, extra_flags=["--max_servers=3"],
                                   pace_ms=10)
        self.assertRegex(said[0], r"re-sharded from 2 to 3 shards at step \d+")
        self.assertRegex(said[1], r"re-sharded from 3 to 1 shards at step \d+")
        for w in ("worker0", "worker1"):
            self.assertIn("following shard map epoch", logs[w])
        for s in (1, 2):
            self.assertIn("retired: the job re-sharded to 1 shards", logs["server%d" % s])
        for name, want in undisturbed.items():
            self.assertTrue(torch.equal(moved[name], want), name)


if __name__ == "__main__":
    unittest.main()
