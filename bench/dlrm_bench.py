#!/usr/bin/python3
"""dlrm_bench: the DLRM of examples/torch/dlrm_criteo.py on the same
Criteo-shaped files (grps-criteo-gen), trained three ways in one run:

  (a) one PyTorch process: the 26 tables as nn.Embedding(sparse=True),
      Adagrad (sparse rows for the tables), the global batch: the
      compute-only yardstick;
  (b) PyTorch DDP (gloo), 2 processes, each its share of the file and the
      tables replicated in each;
  (c) grps sync, 2 workers and 2 servers (grps-local), the tables on the
      servers (examples/torch/dlrm_criteo.py itself).

Each trains the same number of steps of the same global batch over the
same lines, then evaluates on the whole test file. Prints one Markdown
table: examples/s (training only), test AUC and log loss (beside the
best the data allows), and peak memory (every process's peak RSS, summed).

    scripts/dlrm-bench --train train.tsv.gz --test test.tsv.gz --truth truth.json

(a) and (b) index their tables by the distinct ids of the lines they train
on and of the test file (DLRM's preprocessing), found before the clock
starts; grps creates rows as ids arrive.
"""

import argparse
import glob
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EXAMPLE = os.path.join(ROOT, "examples", "torch", "dlrm_criteo.py")
WORKERS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_main(argv):
    """(a) or (b): one process of PyTorch's own training."""
    p = argparse.ArgumentParser()
    p.add_argument("--child", choices=["torch", "ddp"], required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--batch", type=int, required=True, help="this process's batch")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import grps.criteo
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import dlrm_criteo

    torch.set_num_threads(1)
    torch.manual_seed(7)
    # The lines this process trains on, and the test set, in memory; the
    # tables' rows: the distinct ids of every rank's lines and the test's.
    lines = a.steps * a.batch * a.world
    part = [[], [], []]
    for labels, dense, ids in grps.criteo.batches(a.train, 0, 1, 65536):
        for k, v in enumerate((labels, dense, ids)):
            part[k].append(v)
        if sum(len(x) for x in part[0]) >= lines:
            break
    train = [np.concatenate(v)[:lines] for v in part]
    test = dlrm_criteo.read_all(a.test)
    vocab = [torch.from_numpy(np.unique(np.concatenate([train[2][:, j], test[2][:, j].numpy()])))
             for j in range(grps.criteo.TABLES)]

    class Table(nn.Module):
        def __init__(self, ids, dim):
            super().__init__()
            self.ids = ids
            self.rows = nn.Embedding(len(ids), dim, sparse=True)
            nn.init.uniform_(self.rows.weight, -0.5 / dim ** 0.5, 0.5 / dim ** 0.5)

        def forward(self, ids):
            return self.rows(torch.searchsorted(self.ids, ids))

    model = dlrm_criteo.Dlrm(16, [64, 32], [64, 32], embedding=lambda j, d: Table(vocab[j], d))
    if a.child == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://", rank=a.rank, world_size=a.world)
        stepper = nn.parallel.DistributedDataParallel(model)
    else:
        stepper = model
    opt = torch.optim.Adagrad(model.parameters(), lr=a.lr)
    # This rank's lines: i % world == rank, as grps.criteo shares them.
    mine = [torch.from_numpy(np.ascontiguousarray(v[a.rank::a.world])) for v in train]
    if a.child == "ddp":
        torch.distributed.barrier()
    start = time.monotonic()
    for s in range(a.steps):
        at = slice(s * a.batch, (s + 1) * a.batch)
        loss = F.binary_cross_entropy_with_logits(stepper(mine[1][at], mine[2][at]), mine[0][at])
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.monotonic() - start
    accuracy, logloss, auc = dlrm_criteo.evaluate(model, test)
    result = {"seconds": seconds, "examples": a.steps * a.batch, "auc": auc, "logloss": logloss,
              "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "rows": int(sum(len(v) for v in vocab))}
    with open(a.out, "w") as f:
        json.dump(result, f)
    if a.child == "ddp":
        torch.distributed.destroy_process_group()
    return 0


def run_torch(args, work, kind):
    world = 1 if kind == "torch" else WORKERS
    batch = args.batch * WORKERS // world
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    procs = []
    for rank in range(world):
        out = os.path.join(work, "%s-%d.json" % (kind, rank))
        cmd = [sys.executable, os.path.abspath(__file__), "--child=" + kind,
               "--train=" + args.train, "--test=" + args.test, "--batch=%d" % batch,
               "--steps=%d" % args.steps, "--lr=%g" % args.lr, "--rank=%d" % rank,
               "--world=%d" % world, "--out=" + out]
        log = open(os.path.join(work, "%s-%d.log" % (kind, rank)), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), out))
    try:
        for proc, _ in procs:
            if proc.wait(timeout=args.timeout_s) != 0:
                raise RuntimeError("%s: a process failed; logs in %s" % (kind, work))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = [json.load(open(out)) for _, out in procs]
    return {"examples_s": sum(r["examples"] for r in results) / max(r["seconds"] for r in results),
            "auc": results[0]["auc"], "logloss": results[0]["logloss"],
            "rss_mib": sum(r["rss_mib"] for r in results), "rows": results[0]["rows"]}


def run_grps(args, work):
    run = os.path.join(work, "grps")
    tables = subprocess.run([sys.executable, EXAMPLE, "--print_tables"], check=True,
                            capture_output=True, text=True).stdout.strip()
    cmd = [os.path.join(args.bin, "grps-local"), "--servers=2", "--workers=%d" % WORKERS,
           "--mode=sync", "--optimizer=adagrad", "--lr=%g" % args.lr, "--sparse_tables=" + tables,
           "--run_dir=" + run, "--result_json=" + os.path.join(work, "grps.json"),
           "--entry=%s %s --train %s --test %s --examples %d --batch %d --steps %d"
           % (sys.executable, EXAMPLE, args.train, args.test,
              args.steps * args.batch * WORKERS, args.batch, args.steps)]
    with open(os.path.join(work, "grps.log"), "w") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                          timeout=args.timeout_s).returncode != 0:
            raise RuntimeError("grps: the job failed; logs in %s" % run)
    r = json.load(open(os.path.join(work, "grps.json")))
    rate, rss, rows = [], 0.0, 0
    for f in glob.glob(os.path.join(run, "worker-*.log")):
        text = open(f).read()
        m = re.search(r"steps in [\d.]+ s, (\d+) examples/s; peak RSS (\d+) MiB", text)
        if m:
            rate.append(float(m.group(1)))
            rss += float(m.group(2))
    for f in glob.glob(os.path.join(run, "server-*.log")):
        text = open(f).read()
        m = re.search(r"peak RSS ([\d.]+) MiB", text)
        rss += float(m.group(1)) if m else 0
        rows += sum(int(n) for n in re.findall(r"table C\d+: (\d+) rows", text))
    return {"examples_s": sum(rate), "auc": r["final_test_auc"], "logloss": r["final_test_loss"],
            "rss_mib": rss, "rows": rows}


def main():
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child"):
        return child_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--truth", default="", help="grps-criteo-gen's truth.json")
    p.add_argument("--batch", type=int, default=1024, help="examples per worker per step")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--jobs", default="torch,ddp,grps")
    p.add_argument("--bin", default=os.environ.get("GRPS_BIN") or os.path.join(ROOT, "build", "bin"))
    p.add_argument("--timeout_s", type=float, default=1800)
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    args = p.parse_args()
    truth = json.load(open(args.truth)).get("test", {}) if args.truth else {}
    work = tempfile.mkdtemp(prefix="grps-dlrm-bench.")
    rows = []
    try:
        for job in args.jobs.split(","):
            r = run_grps(args, work) if job == "grps" else run_torch(args, work, job)
            rows.append((job, r))
            print("dlrm_bench: %s: %.0f examples/s, AUC %.4f" % (job, r["examples_s"], r["auc"]),
                  file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print("dlrm_bench: work folder %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    names = {"torch": "(a) PyTorch, 1 process, sparse Adagrad", "ddp":
             "(b) DDP gloo, %d processes, tables replicated" % WORKERS,
             "grps": "(c) grps sync, %d workers, 2 servers" % WORKERS}
    base = dict(rows).get("torch", {}).get("examples_s")
    print("%d CPUs; %d steps of %d examples (%d a worker); best test AUC %s, log loss %s"
          % (os.cpu_count(), args.steps, args.batch * WORKERS, args.batch,
             truth.get("best_auc", "?"), truth.get("best_logloss", "?")))
    print()
    print("| configuration | examples/s | ÷ (a) | test AUC | log loss | rows | peak RSS, all processes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for job, r in rows:
        print("| %s | %.0f | %s | %.4f | %.4f | %d | %.0f MiB |"
              % (names[job], r["examples_s"], "%.2f" % (r["examples_s"] / base) if base else "-",
                 r["auc"], r["logloss"], r["rows"], r["rss_mib"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
