"""A Horovod user's script on grps, its import line changed and nothing
else (horovod_worker.py): 2 workers x 64 in sync end within 1e-5 of one
PyTorch process at batch 128 with the same SGD; the broadcasts make every
rank start from rank 0's weights and buffer; metrics average through
hvd.allreduce; the script needs no done(); its StepLR reaches the
servers. The program's own optimizers (SGD in two param groups, Adam,
AdamW, Adagrad), each under StepLR and under OneCycleLR, end after 50
steps of 2 workers within 1e-5 of one process (optimizer_worker.py); so do
those the servers lack (RMSprop, a custom class), which run on the workers.
A job whose --optimizer keeps other state is refused with a clear error."""

import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F
import torch.utils.data

from harness import Job

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import horovod_worker  # noqa: E402  (the script's model and data)
import optimizer_worker  # noqa: E402

STEPS, BATCH, LR, MOMENTUM = 30, 64, 0.01, 0.5
# Not the script's optimizer, lr, momentum or schedule: the program's own
# optimizer (its kind, then each step's hyperparameters) is what runs.
JOB_FLAGS = ["--mode=sync", "--optimizer=adam", "--lr=0.5"]


def one_process():
    """The script's training as one process: rank 0's start, each step the
    batch of both ranks (128), SGD with the same lr and momentum, and the
    same StepLR."""
    torch.manual_seed(100)
    model = horovod_worker.Net()
    data = horovod_worker.dataset(BATCH * 2 * STEPS)
    orders = [list(torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=2, rank=r, shuffle=True, seed=3)) for r in (0, 1)]
    opt = torch.optim.SGD(model.parameters(), lr=LR * 2, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5)
    for i in range(STEPS):
        idx = orders[0][i * BATCH:(i + 1) * BATCH] + orders[1][i * BATCH:(i + 1) * BATCH]
        x, y = data[idx]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        scheduler.step()
    return model.state_dict()


def assert_close(test, want, got, label):
    for name, w in want.items():
        rel = float((got[name] - w).norm() / max(float(w.norm()), 1e-12))
        test.assertLess(rel, 1e-5, "%s: %s differs by %g relative" % (label, name, rel))


class HorovodScript(unittest.TestCase):
    def run_job(self, extra_args=(), flags=JOB_FLAGS, expect_exit=0):
        with Job(servers=2, workers=2, flags=flags) as job:
            outs = [job.path("rank%d.pt" % r) for r in (0, 1)]
            for r in (0, 1):
                job.worker("horovod_worker.py", ["--out", outs[r]] + list(extra_args), rank=r,
                           env_extra={"GRPS_LOCAL_RANK": str(r), "GRPS_LOCAL_SIZE": "2"})
            codes = [job.wait("worker%d" % r, 120) for r in (0, 1)]
            if expect_exit != 0:
                return codes, job.logs()
            self.assertEqual(codes, [0, 0], job.logs())
            self.assertEqual(job.wait("coordinator", 30), 0, job.logs())
            for r in (0, 1):
                self.assertIn("COLLECTIVES OK", job.log("worker%d" % r), job.logs())
            return [torch.load(o) for o in outs], job.log("coordinator")

    def test_trains_as_one_process_with_only_its_import_changed(self):
        (got0, got1), coordinator = self.run_job(["--scheduler"])
        want = one_process()
        self.assertEqual(got0["steps"], STEPS)
        # The default, overlap="auto", turns it on: the first step left the
        # gradients as they were.
        self.assertEqual((got0["overlap"], got1["overlap"]), (True, True))
        for r, got in enumerate((got0, got1)):
            assert_close(self, want, got["state"], "rank %d" % r)
        # The metric is the ranks' mean, the same on both.
        mean = (got0["last_loss"] + got1["last_loss"]) / 2
        self.assertAlmostEqual(got0["avg_loss"], mean, places=6)
        self.assertEqual(got0["avg_loss"], got1["avg_loss"])
        # With no done() and no accuracy, the job completes all the same.
        self.assertIn("no final evaluation", coordinator)
        self.assertIn("the program's optimizer is momentum (the job's flags said adam)",
                      coordinator)

    def test_done_with_no_figures_completes_the_job(self):
        # The script clips as Horovod's docs say (synchronize(), clip, step()
        # in skip_synchronize()): overlap="auto" (the default) stays off,
        # nothing raises.
        (got0, got1), coordinator = self.run_job(["--done", "--clip"])
        self.assertEqual(got0["steps"], STEPS)
        self.assertEqual((got0["overlap"], got1["overlap"]), (False, False))
        self.assertIn("no final evaluation: the evaluating worker's program has none",
                      coordinator)

    def test_an_optimizer_that_evaluates_the_model_again_is_refused_before_the_worker_joins(self):
        codes, logs = self.run_job(["--optimizer", "lbfgs"], expect_exit=1)
        self.assertEqual(codes, [1, 1], logs)
        self.assertIn("NotImplementedError: LBFGS evaluates the model again inside "
                      "step(closure)", logs)


class ServerForm(unittest.TestCase):
    """How a torch param group runs on the servers, and what is refused."""

    def test_a_kind_whose_state_the_jobs_servers_do_not_keep_is_refused_naming_the_flag(self):
        from grps import _torch
        group = {"lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0,
                 "dampening": 0}
        self.assertEqual(_torch._server_form(torch.optim.SGD, group, "nesterov"),
                         {"kind": "momentum", "lr": _torch._f32(0.1), "momentum": _torch._f32(0.9),
                          "weight_decay": 0.0})
        with self.assertRaisesRegex(ValueError, "this program's SGD runs on grps's servers as "
                                    "--optimizer=momentum, but the job's is --optimizer=adam"):
            _torch._server_form(torch.optim.SGD, group, "adam")
        with self.assertRaisesRegex(NotImplementedError, "dampening"):
            _torch._server_form(torch.optim.SGD, dict(group, dampening=0.1), "momentum")
        adamw = {"lr": 0.01, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}
        form = _torch._server_form(torch.optim.AdamW, adamw, "adam")
        self.assertTrue(form["decoupled_weight_decay"])
        self.assertEqual(form["beta2"], _torch._f32(0.99))


def optimizer_one_process(config, steps=50, batch=32, resume=None, load_optimizer=True,
                          workers=2):
    """optimizer_worker.py's training of `workers` ranks as one process at
    batch workers x `batch`; from `resume` (an optimizer_worker.py --save
    file's contents) on, with or without its optimizer's state."""
    torch.manual_seed(100)
    model = horovod_worker.Net()
    opt, scheduler = optimizer_worker.build(model, config, steps)
    start = 0
    if resume is not None:
        start = resume["step"]
        model.load_state_dict(resume["model"])
        scheduler.load_state_dict(resume["scheduler"])
        if load_optimizer:
            opt.load_state_dict(resume["optimizer"])
    data, _ = optimizer_worker.batches(workers, 0, batch, steps)
    orders = [optimizer_worker.batches(workers, r, batch, steps)[1] for r in range(workers)]
    for i in range(start, steps):
        x, y = data[[k for order in orders for k in order[i * batch:(i + 1) * batch]]]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        scheduler.step()
    return model.state_dict()


class TheProgramsOptimizer(unittest.TestCase):
    """The servers run the program's optimizer, each param group with its
    own hyperparameters as the scheduler leaves them at each step: sync, 2
    workers, 50 steps, within 1e-5 of one process."""

    def check(self, config, mode="sync", workers=2):
        """`workers` workers of `config` in `mode` end within 1e-5 of one
        process; returns the coordinator's log."""
        # The job's flags name no optimizer: the program's defines the kind.
        with Job(servers=2, workers=workers, flags=["--mode=" + mode]) as job:
            outs = [job.path("rank%d.pt" % r) for r in range(workers)]
            for r in range(workers):
                job.worker("optimizer_worker.py", ["--config", config, "--out", outs[r]], rank=r)
            codes = [job.wait("worker%d" % r, 120) for r in range(workers)]
            self.assertEqual(codes, [0] * workers, job.logs())
            self.assertEqual(job.wait("coordinator", 30), 0, job.logs())
            got = [torch.load(o) for o in outs]
            coordinator = job.log("coordinator")
        want = optimizer_one_process(config, workers=workers)
        for r in range(workers):
            assert_close(self, want, got[r], "%s %s rank %d" % (config, mode, r))
        return coordinator

    def test_sgd_in_two_param_groups_under_step_lr(self):
        self.check("sgd_groups/step")

    def test_sgd_in_two_param_groups_under_one_cycle(self):
        self.check("sgd_groups/onecycle")

    def test_adam_under_step_lr(self):
        self.check("adam/step")

    def test_adam_under_one_cycle(self):
        self.check("adam/onecycle")

    def test_adamw_under_step_lr(self):
        self.check("adamw/step")

    def test_adamw_under_one_cycle(self):
        self.check("adamw/onecycle")

    def test_adagrad_under_step_lr(self):
        self.check("adagrad/step")

    def test_adagrad_under_one_cycle(self):
        self.check("adagrad/onecycle")

    def test_rmsprop_runs_on_the_workers_on_the_servers_average(self):
        # RMSprop (momentum, weight decay) under StepLR: the servers average
        # the gradients, each worker applies the average with its RMSprop.
        coordinator = self.check("rmsprop/step")
        self.assertIn("the program's optimizer is workers (the job's flags said momentum): it "
                      "runs on the workers, on the gradients the servers average", coordinator)

    def test_a_custom_optimizer_in_two_param_groups_runs_on_the_workers(self):
        self.check("custom/step")

    def test_async_and_ssp_add_the_change_a_workers_own_optimizer_made(self):
        # One worker, so that one process is the reference: each step it
        # applies its RMSprop to its gradient and pushes the weights'
        # change, which the servers add; it pulls the sum.
        for mode in ("async", "ssp"):
            coordinator = self.check("rmsprop/step", mode=mode, workers=1)
            self.assertIn("it runs on the workers, and the servers add the weights' changes "
                          "they push", coordinator)

    def test_a_new_job_resumes_from_a_saved_optimizer_state_dict(self):
        # torch.save(opt.state_dict()) at step 20 of 40 (Adam: its moments
        # and step are the servers'); a new job loads it with the model's
        # and the scheduler's, after wrapping the optimizer (Horovod's
        # order) or before, or on rank 0 only with the broadcasts (Horovod's
        # examples), and ends where the run that went on ends.
        whole, saved = self.resumes("adam/step", (
            [], ["--load_before_wrap"], ["--rank0_loads"]),
            lambda server_log: self.assertIn("rank 0 loaded the optimizer's state", server_log))
        state = saved["optimizer"]["state"]
        self.assertEqual(float(state[0]["step"]), 20.0)
        # The state dict is torch's own: one process resumed from it ends
        # where the job did; resumed without it, far from there.
        assert_close(self, whole, optimizer_one_process("adam/step", 40, resume=saved),
                     "one process resumed")
        cold = optimizer_one_process("adam/step", 40, resume=saved, load_optimizer=False)
        rel = max(float((cold[k] - whole[k]).norm() / whole[k].norm()) for k in whole)
        self.assertGreater(rel, 1e-3, "a resume without the optimizer's state")

    def test_a_job_of_an_optimizer_on_the_workers_resumes_from_its_state_dict(self):
        # RMSprop's square averages and momentum buffers are the workers':
        # torch's own state_dict; with --rank0_loads broadcast_optimizer_state
        # gives rank 0's to rank 1.
        whole, saved = self.resumes("rmsprop/step", ([], ["--rank0_loads"]))
        self.assertIn("square_avg", saved["optimizer"]["state"][0])
        assert_close(self, whole, optimizer_one_process("rmsprop/step", 40, resume=saved),
                     "one process resumed")

    def resumes(self, config, orders, check_server_log=lambda log: None):
        """Trains `config` 40 steps (2 workers, sync), torch.saving at step
        20; a new job resumed from it in each of `orders` (optimizer_worker.py
        flags) must end within 1e-5 of that run. Returns that run's weights
        and the saved dict."""
        def run(args):
            with Job(servers=2, workers=2, flags=["--mode=sync"]) as job:
                outs = [job.path("rank%d.pt" % r) for r in (0, 1)]
                for r in (0, 1):
                    job.worker("optimizer_worker.py", ["--config", config, "--steps", "40",
                                                       "--out", outs[r]] + args, rank=r)
                codes = [job.wait("worker%d" % r, 120) for r in (0, 1)]
                self.assertEqual(codes, [0, 0], job.logs())
                return torch.load(outs[0]), job.log("server0")

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state20.pt")
            whole, _ = run(["--save_at", "20", "--save", path])
            saved = torch.load(path)
            for order in orders:
                resumed, server_log = run(["--resume", path] + order)
                check_server_log(server_log)
                assert_close(self, whole, resumed, "%s resumed %s"
                             % (config, order or "after wrapping"))
        return whole, saved

    def test_async_and_ssp_run_the_pushing_workers_learning_rate(self):
        # The program's LambdaLR holds the lr at 0 (the job's flags say
        # 0.5): after 10 steps of each worker the weights are rank 0's start.
        torch.manual_seed(100)
        start = horovod_worker.Net().state_dict()
        for mode in ("async", "ssp"):
            with Job(servers=2, workers=2, flags=["--mode=" + mode, "--lr=0.5"]) as job:
                outs = [job.path("rank%d.pt" % r) for r in (0, 1)]
                for r in (0, 1):
                    job.worker("optimizer_worker.py", ["--config", "halted", "--steps", "10",
                                                       "--out", outs[r]], rank=r)
                codes = [job.wait("worker%d" % r, 120) for r in (0, 1)]
                self.assertEqual(codes, [0, 0], job.logs())
                got = [torch.load(o) for o in outs]
            for r in (0, 1):
                for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
                    self.assertTrue(torch.equal(got[r][name], start[name]),
                                    "%s: rank %d's %s moved" % (mode, r, name))


class CurveAndStraggler(unittest.TestCase):
    """What grps-local gives an entry worker: GRPS_CURVE_CSV, where
    grps.torch writes grps-worker's curve columns (a row per gt.report(),
    evaluations marked), and GRPS_STRAGGLE_MS / _FACTOR, after which each
    step sleeps (scripts/grps-compare --entry reads and makes both)."""

    def test_the_curve_has_a_row_per_report_and_the_straggler_sleeps(self):
        steps, delay_ms = 12, 100
        with Job(servers=1, workers=2, flags=["--mode=sync", "--optimizer=adam"]) as job:
            curves = [job.path("curve-%d.csv" % r) for r in (0, 1)]
            for r in (0, 1):
                env = {"GRPS_CURVE_CSV": curves[r]}
                if r == 1:
                    env["GRPS_STRAGGLE_MS"] = str(delay_ms)
                job.worker("optimizer_worker.py",
                           ["--config", "adam/step", "--steps", str(steps), "--report",
                            "--out", job.path("rank%d.pt" % r)], rank=r, env_extra=env)
            self.assertEqual([job.wait("worker%d" % r, 120) for r in (0, 1)], [0, 0], job.logs())
            self.assertIn("a straggler: 1x its own step time + 100 ms per step",
                          job.log("worker1"))
            self.assertNotIn("a straggler", job.log("worker0"))
            rows = []
            for path in curves:
                with open(path) as f:
                    self.assertEqual(f.readline().strip(),
                                     "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,"
                                     "test_accuracy,test_loss,evaluated,test_auc")
                    rows.append([line.strip().split(",") for line in f])
        for r in (0, 1):
            self.assertEqual(len(rows[r]), steps + 2, rows[r])  # each step, then 2 evaluations
            self.assertEqual([row[0] for row in rows[r][:steps]],
                             [str(s) for s in range(1, steps + 1)])
            self.assertEqual([row[8] for row in rows[r]], ["0"] * steps + ["1", "1"])
            self.assertEqual(float(rows[r][-2][6]), 0.5)
            self.assertEqual(float(rows[r][-1][6]), 0.75)
        # The straggler slept after each step but the first: a lower bound.
        elapsed = float(rows[1][steps - 1][2]) - float(rows[1][0][2])
        self.assertGreaterEqual(elapsed, (steps - 2) * delay_ms / 1000.0)


class ModuleIsAnApi(unittest.TestCase):
    def test_only_api_names_are_public(self):
        out = subprocess.run(
            [sys.executable, "-c", "import grps.torch as gt; "
             "print(sorted(n for n in dir(gt) if not n.startswith('_')))"],
            capture_output=True, text=True, timeout=60, check=True).stdout
        names = eval(out)  # noqa: S307 - our own subprocess's list literal
        import grps.torch as gt
        self.assertEqual(names, sorted(gt.__all__))
        for module_name in ("np", "os", "sys", "torch", "math", "signal", "threading"):
            self.assertNotIn(module_name, names)
        for horovod_name in ("init", "rank", "size", "local_rank", "local_size", "allreduce",
                             "broadcast_parameters", "broadcast_optimizer_state",
                             "DistributedOptimizer", "Compression", "Average", "Sum"):
            self.assertIn(horovod_name, names)


if __name__ == "__main__":
    unittest.main()
