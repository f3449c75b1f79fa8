"""A worker of the same-weights tests: trains OddCnn on its share of each
step's global batch and saves the job's final weights (rank 0)."""

import argparse
import time

import torch
import torch.nn.functional as F

import grps.torch as gt
from odd_cnn import GLOBAL_BATCH, batch, make_model

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--passes", type=int, default=1)
parser.add_argument("--out", default="")
parser.add_argument("--pace_ms", type=int, default=0, help="sleep before each step")
parser.add_argument("--hold_until", default="",
                    help="before gt.done(), wait (at most 120 s) until this file exists")
parser.add_argument("--nan_at", type=int, default=-1,
                    help="before this step, try steps with a NaN gradient (refused)")
parser.add_argument("--clip_at", type=int, default=-1,
                    help="at this step, clip the gradients between backward() and step()")
parser.add_argument("--discard_at", type=int, default=-1,
                    help="at this step, run a backward() whose gradients are discarded "
                         "(zero_grad(), then the step's own backward())")
parser.add_argument("--clip_every", type=int, default=0,
                    help="1: clip the gradients between backward() and step() at every step")
parser.add_argument("--overlap", default="", choices=["", "auto", "0", "1"],
                    help="push each gradient from its hook: auto, 0 or 1 (none: the "
                         "default, auto)")
parser.add_argument("--device", default="cpu", help="where the model trains: cpu or cuda")
args = parser.parse_args()
device = torch.device(args.device)
if device.type == "cuda":
    # Full float32, as the CPU reference: no TF32 in convolutions (on by
    # default in PyTorch) or matrix products.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

gt.init()
model = make_model().to(device)
overlap = {"auto": {"overlap": "auto"}, "0": {"overlap": False}, "1": {"overlap": True}}
opt = gt.DistributedOptimizer(model.named_parameters(), backward_passes_per_step=args.passes,
                              **overlap.get(args.overlap, {}))
gt.broadcast_parameters(model)
share = GLOBAL_BATCH // gt.size()
per_pass = share // args.passes
def attempt(kind, f, refusal=ValueError):
    """Prints "KIND: accepted" or "KIND: <refusal type>: <message>"."""
    try:
        f()
        print("%s: accepted" % kind, flush=True)
    except refusal as e:
        print("%s: %s: %s" % (kind, type(e).__name__, e), flush=True)


def poisoned_step():
    """NaN gradients (from the loss, pushed by the hooks; set between
    backward() and step(), without them) and a float64 gradient array: each
    refused, nothing pushed."""
    import numpy as np
    overlap = opt.overlap
    opt.zero_grad()
    x, y = batch(0, 0, 4)
    x, y = x.to(device), y.to(device)
    (F.cross_entropy(model(x), y) * float("nan")).backward()
    attempt("NAN_LOSS", opt.step)
    opt.overlap = False
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    model.fc.weight.grad[3, 5] = float("nan")
    attempt("NAN", opt.step)
    opt.overlap = overlap
    n = opt.worker.num_parameters
    attempt("F64", lambda: opt.worker.step(np.zeros(n, dtype=np.float64),
                                           np.zeros(n, dtype=np.float32), 1))


# By the job's step, not a count of our own: a restarted rank resumes where
# it is, and after a roll-back the same batches are trained again.
while gt.step() < args.steps:
    step = gt.step()
    if step == args.nan_at:
        poisoned_step()
    if args.pace_ms:
        time.sleep(args.pace_ms / 1000.0)
    if step == args.discard_at:
        x, y = batch(step + 1, gt.rank() * share, per_pass)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    opt.zero_grad()
    for k in range(args.passes):
        x, y = batch(step, gt.rank() * share + k * per_pass, per_pass)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    if step == args.discard_at:
        args.discard_at = -1  # once
        attempt("DISCARD", lambda: opt.step(samples=share), refusal=gt.Error)
        continue  # the step again, its pushed gradients deduplicated
    if step == args.clip_at:
        args.clip_at = -1  # once
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        attempt("CLIP", lambda: opt.step(samples=share), refusal=gt.Error)
        continue  # the step again, its pushed gradients deduplicated
    if args.clip_every:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)  # clips nothing
    opt.step(samples=share)
    if args.out and step < 2:
        print("EARLY %d: %d of %d parameters pushed by their hooks"
              % (step, opt.last_early, len(list(opt.param_groups[0]["params"]))), flush=True)
print("OVERLAP: %s" % ("on" if opt.overlap else "off"), flush=True)
if args.out:
    weights = gt.state_dict()
    weights["__model__"] = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    torch.save(weights, args.out)
if args.hold_until:
    import os
    end = time.time() + 120
    while not os.path.exists(args.hold_until) and time.time() < end:
        time.sleep(0.05)
gt.done(test_accuracy=0.0, test_loss=0.0)
