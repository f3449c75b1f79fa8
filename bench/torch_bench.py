#!/usr/bin/python3
"""torch_bench: PyTorch models trained through grps, beside PyTorch's own
ways of training them, measured in one run on the same cores.

For each model (the Fashion-MNIST CNN of examples/torch/fashion_cnn.py and
an MLP 784-4096-3072-10) it measures training samples/s of:

  (a) one PyTorch process, torch.optim.SGD on the global batch (2 x the
      per-worker batch), 2 torch threads: the compute-only yardstick;
  (b) DistributedDataParallel, gloo, 2 processes of 1 thread on loopback;
  (c) grps, 2 Python workers of 1 thread (grps.torch) and 2 servers, sync
      and async, each with shared-memory lanes (--local_transport=shm) and
      with every byte through gRPC (--local_transport=grpc).

and prints one Markdown table: samples/s, the ratio to (a), and for grps
sync the ratio to DDP. The data is random tensors of the models' shapes,
made before the timed loop; each configuration trains a few warm-up steps,
then every process waits at a barrier, then the timed steps. A
configuration's rate is all its processes' timed samples over the time from
the first timed step's start to the last one's end (in async, where the
workers do not wait for each other, that is the job's rate, not the sum of
each worker's own). Plain SGD (no momentum) with the same learning rate
everywhere; the optimizer runs on the servers in (c). Every configuration
runs once per round (--repeat rounds, one after the other, so a change in
the machine's other load falls on all of them alike); the table gives the
best round's rate and lists every round's.

    scripts/torch-bench                      # the defaults: 3 rounds, about 4 to 6 minutes
    scripts/torch-bench --quick              # one round of a few steps (the ctest smoke run)
    scripts/torch-bench --steps=50 --repeat=1 --json=out.json
    scripts/torch-bench --models=mlp --grps_flags=--chunk_kb=4096   # grps's chunks of 4 MiB

Every process it starts (the ranks, the workers, the grps daemons) is ended
by its PID when its configuration is over, also on failure, timeout, Ctrl-C
or SIGTERM, and dies with it if it is killed outright. Exits 1 when a
configuration failed (its row says "failed").
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "torch")
HARNESS_DIR = os.path.join(ROOT, "python", "tests")

MODELS = {
    # name: (title in the table, timed steps, warm-up steps by default)
    "cnn": ("CNN (fashion_cnn.Net)", 200, 5),
    "mlp": ("MLP 784-4096-3072-10", 30, 3),
    # scripts/cross-host-bench's model (23.3 MB of f32), there on network hosts
    "mlp2048": ("MLP 784-2048-2048-10", 30, 3),
}
MLP_WIDTHS = {"mlp": (784, 4096, 3072, 10), "mlp2048": (784, 2048, 2048, 10)}
# (key, label, mode, local transport); (a) and (b) are PyTorch's own.
CONFIGS = [
    ("torch", "(a) PyTorch, 1 process, 2 threads, global batch", None, None),
    ("ddp", "(b) DDP gloo, 2 processes x 1 thread", None, None),
    ("sync_shm", "(c) grps sync, lanes (shm)", "sync", "shm"),
    ("sync_grpc", "(c) grps sync, gRPC only", "sync", "grpc"),
    ("async_shm", "(c) grps async, lanes (shm)", "async", "shm"),
    ("async_grpc", "(c) grps async, gRPC only", "async", "grpc"),
]
WORKERS = 2
SERVERS = 2


# ---------------------------------------------------------------------------
# The processes that train (run as `torch_bench.py --child=KIND ...`).

def make_model(name):
    import torch.nn as nn
    if name == "cnn":
        sys.path.insert(0, EXAMPLES)
        from fashion_cnn import Net
        return Net()
    widths = MLP_WIDTHS[name]
    layers = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_batches(model_name, batch, seed, count=4):
    """`count` random batches of the model's input shape, made once."""
    import torch
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 1, 28, 28) if model_name == "cnn" else (batch, 784)
    return [(torch.randn(shape, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(count)]


def file_barrier(folder, rank, world, seconds=120):
    """Every rank of `world` has called this (a file per rank in `folder`)."""
    open(os.path.join(folder, "ready.%d" % rank), "w").close()
    end = time.monotonic() + seconds
    while sum(1 for f in os.listdir(folder) if f.startswith("ready.")) < world:
        if time.monotonic() > end:
            raise TimeoutError("barrier: not every rank ready after %d s" % seconds)
        time.sleep(0.001)


def child_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--child", choices=["torch", "ddp", "grps"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True, help="this process's batch")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=WORKERS,
                   help="ddp: the world size; ddp and grps: the ranks at the barrier")
    p.add_argument("--barrier", default="", help="grps: the barrier's folder")
    p.add_argument("--overlap", type=int, default=1,
                   help="grps: push each gradient from its hook (1) or all at step() (0)")
    p.add_argument("--out", required=True, help="this process's result (JSON)")
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = make_model(a.model)

    if a.child == "torch":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
        stepper = model
    elif a.child == "ddp":
        import torch.distributed as dist
        # The rendezvous at MASTER_ADDR:MASTER_PORT from the environment (here
        # 127.0.0.1 and a free port; scripts/cross-host-bench: rank 0's host).
        dist.init_process_group("gloo", init_method="env://", rank=a.rank, world_size=a.world)
        stepper = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    else:
        import grps.torch as gt
        gt.init()
        opt = gt.DistributedOptimizer(model.named_parameters(), overlap=bool(a.overlap))
        gt.broadcast_parameters(model)
        stepper = model
        a.rank = gt.rank()

    batches = make_batches(a.model, a.batch, seed=100 + a.rank)

    def train(steps, offset):
        for s in range(steps):
            x, y = batches[(offset + s) % len(batches)]
            loss = F.cross_entropy(stepper(x), y)
            opt.zero_grad()
            loss.backward()
            if a.child == "grps":
                opt.step(samples=a.batch)
            else:
                opt.step()
        return float(loss)

    train(a.warmup, 0)
    if a.child == "ddp":
        torch.distributed.barrier()
    elif a.child == "grps":
        file_barrier(a.barrier, a.rank, a.world)
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
    loss = train(a.steps, a.warmup)
    end = time.monotonic()
    result = {"rank": a.rank, "start": start, "end": end, "steps": a.steps,
              "samples": a.steps * a.batch, "loss": loss,
              "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    with open(a.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(a.out + ".tmp", a.out)
    if a.child == "ddp":
        torch.distributed.destroy_process_group()
    elif a.child == "grps":
        gt.done(test_accuracy=0.0, test_loss=0.0)
    return 0


# ---------------------------------------------------------------------------
# The parent: starts each configuration's processes, collects, prints.

class ConfigFailed(Exception):
    pass


class Processes:
    """Processes of one configuration; every one still running at exit is
    sent SIGTERM, then SIGKILL after 5 s, by its PID. Like the harness's
    daemons, they are killed when this process dies without unwinding."""

    def __init__(self, work):
        self.work = work
        self.procs = {}

    def __enter__(self):
        return self

    def start(self, name, args, env):
        from harness import _die_with_parent  # SIGKILL if this process dies outright
        with open(os.path.join(self.work, name + ".log"), "ab") as log:
            self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True,
                                                preexec_fn=_die_with_parent)

    def wait_all(self, deadline):
        for name, proc in self.procs.items():
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ConfigFailed("%s still running at the configuration's timeout" % name)
            if rc != 0:
                raise ConfigFailed("%s exited %d" % (name, rc))

    def logs(self):
        out = []
        for name in sorted(self.procs):
            with open(os.path.join(self.work, name + ".log"), errors="replace") as f:
                out.append("---- %s\n%s" % (name, f.read()[-3000:]))
        return "\n".join(out)

    def __exit__(self, *exc):
        end_procs(self.procs.values())
        return False


def end_procs(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(args, threads):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        x for x in (args.python_dir, env.get("PYTHONPATH", "")) if x)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def child_args(args, kind, model, batch, threads, out, **extra):
    steps, warmup = args.model_steps[model]
    argv = [sys.executable, os.path.abspath(__file__), "--child=" + kind, "--model=" + model,
            "--batch=%d" % batch, "--threads=%d" % threads, "--warmup=%d" % warmup,
            "--steps=%d" % steps, "--lr=%g" % args.lr, "--out=" + out]
    return argv + ["--%s=%s" % kv for kv in extra.items()]


def read_results(paths):
    results = []
    for path in paths:
        if not os.path.exists(path):
            raise ConfigFailed("no result in %s" % path)
        with open(path) as f:
            results.append(json.load(f))
    window = max(r["end"] for r in results) - min(r["start"] for r in results)
    samples = sum(r["samples"] for r in results)
    return {"samples_per_s": samples / window, "window_s": window, "samples": samples,
            "per_process": [dict(r, samples_per_s=r["samples"] / (r["end"] - r["start"]))
                            for r in results]}


def run_torch(args, model, work, deadline):
    out = os.path.join(work, "torch.json")
    with Processes(work) as procs:
        procs.start("torch", child_args(args, "torch", model, WORKERS * args.batch, 2, out),
                    child_env(args, 2))
        try:
            procs.wait_all(deadline)
        except ConfigFailed as e:
            raise ConfigFailed("%s\n%s" % (e, procs.logs()))
    return read_results([out])


def run_ddp(args, model, work, deadline):
    port = free_port()
    outs = [os.path.join(work, "ddp%d.json" % r) for r in range(WORKERS)]
    with Processes(work) as procs:
        for r in range(WORKERS):
            procs.start("rank%d" % r, child_args(args, "ddp", model, args.batch, 1, outs[r],
                                                 rank=r),
                        dict(child_env(args, 1), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        try:
            procs.wait_all(deadline)
        except ConfigFailed as e:
            raise ConfigFailed("%s\n%s" % (e, procs.logs()))
    return read_results(outs)


def run_grps(args, model, mode, transport, work, deadline):
    import harness  # python/tests/harness.py: the daemons, torn down by PID
    barrier = os.path.join(work, "barrier")
    os.makedirs(barrier)
    outs = [os.path.join(work, "grps%d.json" % r) for r in range(WORKERS)]
    flags = ["--mode=" + mode, "--local_transport=" + transport, "--optimizer=sgd",
             "--lr=%g" % args.lr, "--momentum=0", "--weight_decay=0"] + args.grps_flags.split()
    with harness.Job(servers=SERVERS, workers=WORKERS, flags=flags) as job:
        threads = {k: v for k, v in child_env(args, 1).items() if k.endswith("_THREADS")}
        for r in range(WORKERS):
            argv = child_args(args, "grps", model, args.batch, 1, outs[r], barrier=barrier,
                              overlap=args.overlap)
            job.worker(argv[1], argv[2:], rank=r, env_extra=threads)
        names = ["worker%d" % r for r in range(WORKERS)] + ["coordinator"]
        for name in names:
            try:
                rc = job.wait(name, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ConfigFailed("grps %s still running at the configuration's timeout\n%s"
                                   % (name, job.logs()))
            if rc != 0:
                raise ConfigFailed("grps %s exited %d\n%s" % (name, rc, job.logs()))
    return read_results(outs)


def run_config(args, model, key, mode, transport):
    work = tempfile.mkdtemp(prefix="torch-bench.%s.%s." % (model, key))
    deadline = time.monotonic() + args.timeout_s
    keep = False
    try:
        if key == "torch":
            return run_torch(args, model, work, deadline)
        if key == "ddp":
            return run_ddp(args, model, work, deadline)
        return run_grps(args, model, mode, transport, work, deadline)
    except ConfigFailed as e:
        keep = True
        raise ConfigFailed("%s\n(logs kept in %s)" % (e, work))
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def ratio(x, y):
    return "%.2f" % (x / y) if x and y else "–"


def best(rounds):
    """The round with the highest rate (the least disturbed by other work
    on the machine), or None when every round failed."""
    done = [r for r in rounds if r]
    return max(done, key=lambda r: r["samples_per_s"]) if done else None


def table(args, results):
    """results[(model, key)]: one entry per round, None where it failed."""
    models = args.models
    head = "| configuration | " + " | ".join(
        "%s samples/s | ÷ (a) | ÷ DDP | rounds" % MODELS[m][0] for m in models) + " |"
    lines = [head, "|" + " --- |" * (1 + 4 * len(models))]
    for key, label, mode, _ in CONFIGS:
        cells = [label]
        for m in models:
            rounds = results.get((m, key), [])
            r, a, ddp = best(rounds), best(results.get((m, "torch"), [])), \
                best(results.get((m, "ddp"), []))
            rate = r and r["samples_per_s"]
            cells.append("{:,.0f}".format(rate) if rate else "failed")
            cells.append(ratio(rate, a and a["samples_per_s"]))
            cells.append(ratio(rate, ddp and ddp["samples_per_s"]) if mode == "sync" else "–")
            cells.append(" / ".join("{:,.0f}".format(x["samples_per_s"]) if x else "failed"
                                    for x in rounds))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args():
    p = argparse.ArgumentParser(
        description="PyTorch models through grps beside one PyTorch process and DDP (gloo).")
    p.add_argument("--models", default="cnn,mlp",
                   help="comma-separated: %s" % ", ".join(MODELS))
    p.add_argument("--batch", type=int, default=64, help="examples per worker per step")
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per configuration (default: cnn %d, mlp %d)"
                   % (MODELS["cnn"][1], MODELS["mlp"][1]))
    p.add_argument("--warmup", type=int, default=-1,
                   help="untimed steps first (default: cnn %d, mlp %d)"
                   % (MODELS["cnn"][2], MODELS["mlp"][2]))
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds of every configuration; each figure is the best round's")
    p.add_argument("--quick", action="store_true",
                   help="one round of 2 timed steps after 1 warm-up step (a smoke run; its "
                        "figures mean nothing)")
    p.add_argument("--lr", type=float, default=0.01, help="plain SGD's learning rate")
    p.add_argument("--overlap", type=int, default=1, choices=[0, 1],
                   help="grps: push each gradient from its hook (1) or all at step() (0)")
    p.add_argument("--grps_flags", default="",
                   help="more flags for grps's coordinator, space-separated (e.g. "
                        "--chunk_kb=4096); the summary names them")
    p.add_argument("--json", default="", help="also write the figures to this file")
    p.add_argument("--bin", default=os.environ.get("GRPS_BIN") or os.path.join(ROOT, "build", "bin"),
                   help="the grps binaries (default $GRPS_BIN, else build/bin)")
    p.add_argument("--python_dir", default="",
                   help="the built grps package's folder (default $GRPS_PYTHON_DIR, else "
                        "BIN/../python)")
    p.add_argument("--timeout_s", type=float, default=180,
                   help="a configuration still running after this long fails")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error("unknown model %r (%s)" % (m, ", ".join(MODELS)))
    args.python_dir = (args.python_dir or os.environ.get("GRPS_PYTHON_DIR") or
                       os.path.join(os.path.dirname(os.path.abspath(args.bin)), "python"))
    args.model_steps = {}
    for m in args.models:
        steps, warmup = MODELS[m][1], MODELS[m][2]
        if args.quick:
            steps, warmup, args.repeat = 2, 1, 1
        args.model_steps[m] = (args.steps or steps, warmup if args.warmup < 0 else args.warmup)
    return args


def main():
    args = parse_args()
    for need in ("grps-coordinator", "grps-server"):
        if not os.access(os.path.join(args.bin, need), os.X_OK):
            print("torch_bench: no %s in %s (build it, or point --bin at it)" % (need, args.bin),
                  file=sys.stderr)
            return 2
    if not os.path.isdir(os.path.join(args.python_dir, "grps")):
        print("torch_bench: no grps package in %s (--python_dir)" % args.python_dir,
              file=sys.stderr)
        return 2
    os.environ["GRPS_BIN"] = args.bin  # for the harness, read as it is imported
    os.environ["GRPS_PYTHON_DIR"] = args.python_dir
    sys.path.insert(0, HARNESS_DIR)

    # SIGTERM unwinds like Ctrl-C, so every configuration's processes end;
    # SIGINT too where it was ignored (a shell's background job).
    def on_signal(signum, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    load_before = os.getloadavg()
    began = time.monotonic()
    results, failures = {}, []
    # Round by round, every configuration once per round: a change in the
    # machine's other load falls on all of them alike.
    for round_ in range(args.repeat):
        for m in args.models:
            for key, label, mode, transport in CONFIGS:
                t = time.monotonic()
                rounds = results.setdefault((m, key), [])
                try:
                    rounds.append(run_config(args, m, key, mode, transport))
                    r = rounds[-1]
                    print("torch_bench: round %d, %s, %s: %.0f samples/s (%.1f s timed, %.1f s "
                          "in all)" % (round_ + 1, m, label, r["samples_per_s"], r["window_s"],
                                       time.monotonic() - t), file=sys.stderr, flush=True)
                except Exception as e:  # noqa: BLE001 (the row says "failed"; the others go on)
                    rounds.append(None)
                    failures.append("round %d, %s, %s: %s" % (round_ + 1, m, label, e))
                    print("torch_bench: round %d, %s, %s FAILED: %s" % (round_ + 1, m, label, e),
                          file=sys.stderr, flush=True)
    took = time.monotonic() - began
    load_after = os.getloadavg()

    print("# PyTorch models: grps beside one PyTorch process and DDP\n")
    print("%d CPUs (os.cpu_count), load average %.1f before and %.1f after; per-worker batch "
          "%d, global batch %d; plain SGD lr %g; %s; best of %d round%s; %.0f s in all.\n"
          % (os.cpu_count(), load_before[0], load_after[0], args.batch, WORKERS * args.batch,
             args.lr, "; ".join("%s: %d timed steps after %d warm-up" % (m, s, w)
                                for m, (s, w) in args.model_steps.items()),
             args.repeat, "" if args.repeat == 1 else "s", took))
    print(table(args, results))
    print("\n(a) is the compute-only yardstick; (c) has %d servers and %d workers of 1 torch "
          "thread; ÷ DDP is given for grps sync, which computes what DDP computes. Each "
          "figure is the best round's; \"rounds\" lists every round's.%s"
          % (SERVERS, WORKERS, " grps's coordinator had " + args.grps_flags + "."
             if args.grps_flags else ""))
    if args.json:
        rows = []
        for m in args.models:
            a, ddp = best(results[(m, "torch")]), best(results[(m, "ddp")])
            for key, label, _, _ in CONFIGS:
                r = best(results[(m, key)])
                rate = r and r["samples_per_s"]
                rows.append({
                    "model": m, "config": key, "label": label, "samples_per_s": rate,
                    "ratio_to_a": rate / a["samples_per_s"] if rate and a else None,
                    "ratio_to_ddp": rate / ddp["samples_per_s"] if rate and ddp else None,
                    "rounds": results[(m, key)]})
        with open(args.json, "w") as f:
            json.dump({
                "cpus": os.cpu_count(), "load_average_before": load_before[0],
                "load_average_after": load_after[0], "seconds": took, "repeat": args.repeat,
                "batch_per_worker": args.batch, "workers": WORKERS, "servers": SERVERS,
                "lr": args.lr,
                "steps": {m: {"timed": s, "warmup": w} for m, (s, w) in args.model_steps.items()},
                "results": rows, "failures": failures,
            }, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    if any(a.startswith("--child") for a in sys.argv[1:]):
        sys.exit(child_main(sys.argv[1:]))
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("torch_bench: interrupted; every process it started has been ended",
              file=sys.stderr)
        sys.exit(130)
