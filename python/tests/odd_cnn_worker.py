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
parser.add_argument("--step_ms", type=float, default=0,
                    help="sleep this long after each step (paces a test job)")
args = parser.parse_args()

gt.init()
model = make_model()
opt = gt.DistributedOptimizer(model.named_parameters(), backward_passes_per_step=args.passes)
gt.broadcast_parameters(model)
share = GLOBAL_BATCH // gt.size()
per_pass = share // args.passes
for step in range(args.steps):
    opt.zero_grad()
    for k in range(args.passes):
        x, y = batch(step, gt.rank() * share + k * per_pass, per_pass)
        F.cross_entropy(model(x), y).backward()
    opt.step(samples=share)
    if args.step_ms > 0:
        time.sleep(args.step_ms / 1000)
if args.out:
    weights = gt.state_dict()
    weights["__model__"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(weights, args.out)
gt.done(test_accuracy=0.0, test_loss=0.0)
