"""Acceptance: bad input from a Python worker (another model's parameters,
a NaN gradient, an array of the wrong dtype, a parameter of the wrong dtype
or device, a wrong job id or token) ends in a clear Python exception, and
no server's state changes (the job trains on to one process's weights)."""

import subprocess
import sys
import unittest

import torch

from harness import HERE, PYTHON_DIR, Job
from odd_cnn import reference

STEPS = 20
LR = 0.05
FLAGS = ["--mode=sync", "--optimizer=sgd", "--lr=%g" % LR, "--momentum=0", "--weight_decay=0"]


def line(log, kind):
    for l in log.splitlines():
        if l.startswith(kind + ":"):
            return l
    return ""


class BadInput(unittest.TestCase):
    def test_refusals_leave_the_job_as_one_process_would(self):
        with Job(servers=2, workers=1, flags=FLAGS, tokens=("admin-t", "worker-t")) as job:
            out, hold = job.path("rank0.pt"), job.path("probes-done")
            job.worker("odd_cnn_worker.py", ["--steps", str(STEPS), "--nan_at", "3",
                                             "--overlap", "1",
                                             "--out", out, "--hold_until", hold], rank=0)
            job.wait_running()
            model_before = job.status()["config"]["model_tensors"]
            job.worker("probe.py", ["mismatch"], name="mismatch")
            job.worker("probe.py", ["job_id"], name="job_id")
            job.worker("probe.py", ["token"], name="token",
                       env_extra={"GRPS_WORKER_TOKEN": "wrong"})
            for name in ("mismatch", "job_id", "token"):
                self.assertEqual(job.wait(name, 60), 0, job.logs())
            self.assertEqual(job.status()["config"]["model_tensors"], model_before)
            open(hold, "w").close()
            self.assertEqual(job.wait("worker0", 120), 0, job.logs())

            m = line(job.log("mismatch"), "MISMATCH")
            self.assertIn("ModelMismatch", m)
            self.assertIn("'0.weight'", m, "names the first parameter that differs")
            self.assertIn("is 'scale' in the job's model", m, "and what the job has there")
            j = line(job.log("job_id"), "JOB_ID")
            self.assertIn("Error: FAILED_PRECONDITION", j)
            self.assertIn("not-this-job", j)
            t = line(job.log("token"), "TOKEN")
            self.assertIn("UNAUTHENTICATED", t)
            nan = line(job.log("worker0"), "NAN_LOSS")  # refused by the first hook
            self.assertIn("ValueError: parameter '", nan)
            self.assertIn("is nan: nothing was pushed", nan)
            nan = line(job.log("worker0"), "NAN")  # refused at step()
            self.assertIn("ValueError: parameter 'fc.weight' (element 461)", nan)
            self.assertIn("nothing was pushed", nan)
            self.assertIn("F64: ValueError: the gradient must be float32", job.log("worker0"))

            got = torch.load(out)["__model__"]
            want = reference(STEPS, LR)
            for name, w in want.items():
                rel = (got[name] - w).norm() / max(w.norm(), 1e-12)
                self.assertLess(float(rel), 1e-5, name)

    def test_a_gradient_changed_after_its_hook_pushed_it_is_refused(self):
        # Clipping between backward() and step() only at step 2: the first
        # step changed nothing, so overlap="auto" turned overlap on; the
        # step is refused, saying how to clip, and the worker goes on with
        # that step.
        with Job(servers=1, workers=1, flags=FLAGS) as job:
            job.worker("odd_cnn_worker.py", ["--steps", "4", "--clip_at", "2", "--overlap", "auto"],
                       rank=0)
            self.assertEqual(job.wait("worker0", 120), 0, job.logs())
            clip = line(job.log("worker0"), "CLIP")
            self.assertIn("Error: the gradient of parameter '", clip)
            self.assertIn("changed between backward() and step()", clip)
            self.assertIn("overlap=False", clip)

    def test_a_backward_run_again_before_step_is_refused_saying_so(self):
        # A backward() whose gradients the program discards (zero_grad(),
        # then the step's own backward()): with overlap on, the first one's
        # were pushed as they were made. Refused, saying what happened (it
        # was called a change "to clip or unscale"); the worker goes on.
        with Job(servers=1, workers=1, flags=FLAGS) as job:
            job.worker("odd_cnn_worker.py", ["--steps", "4", "--discard_at", "2",
                                             "--overlap", "1"], rank=0)
            self.assertEqual(job.wait("worker0", 120), 0, job.logs())
            discard = line(job.log("worker0"), "DISCARD")
            self.assertIn("Error: backward() made the gradient of parameter '", discard)
            self.assertIn("2 times before step(), 1 a step", discard)
            self.assertIn("overlap=False", discard)

    def test_a_program_that_clips_every_step_keeps_auto_overlap_off(self):
        # clip_grad_norm_ between backward() and step() in the first step (it
        # clips nothing here, but changes the gradients in place): "auto"
        # leaves overlap off, every step is pushed at step() and accepted.
        with Job(servers=1, workers=1, flags=FLAGS) as job:
            job.worker("odd_cnn_worker.py", ["--steps", "4", "--clip_every", "1", "--overlap", "auto",
                                             "--out", job.path("rank0.pt")], rank=0)
            self.assertEqual(job.wait("worker0", 120), 0, job.logs())
            log = job.log("worker0")
            self.assertIn("EARLY 0: 0 of 7 parameters", log)
            self.assertIn("EARLY 1: 0 of 7 parameters", log)
            self.assertNotIn("Error", log)

    def test_an_exception_between_backward_and_step_ends_the_worker_as_its_own(self):
        # With overlap on, backward() started the step's pushes, each pulling
        # the next weights into the model: they end before Python frees it
        # (the worker died of a corrupted heap, "malloc(): unaligned tcache
        # chunk detected", SIGABRT, in place of the program's exit status).
        with Job(servers=1, workers=1, flags=FLAGS) as job:
            job.worker("raising_worker.py", rank=0)
            self.assertEqual(job.wait("worker0", 120), 1, job.logs())
            log = job.log("worker0")
            self.assertIn("RuntimeError: raised between backward() and step()", log)
            self.assertNotIn("malloc", log)

    def test_parameters_of_the_wrong_dtype_or_device_are_refused_before_joining(self):
        out = subprocess.run([sys.executable, "probe.py", "local"], cwd=HERE, timeout=60,
                             capture_output=True, text=True,
                             env={"PYTHONPATH": PYTHON_DIR, "PATH": "/usr/bin:/bin"})
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("DTYPE: ValueError: parameter '0.weight' is torch.float64", out.stdout)
        self.assertIn("DEVICE: ValueError: parameter 'weight' is on device meta", out.stdout)


if __name__ == "__main__":
    unittest.main()
