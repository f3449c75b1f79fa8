"""A worker of the sparse test: gt.EmbeddingBag rows on the servers, a
dense head; rank 0 saves the table's rows before and after, and the head."""

import argparse
import time

import torch
import torch.nn.functional as F

import grps.torch as gt
from bag_model import BAGS, DIM, IDS, batch, head

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--mode", default="mean")
parser.add_argument("--out", default="")
parser.add_argument("--pace_ms", type=float, default=0, help="sleep after each step")
parser.add_argument("--dim", type=int, default=DIM, help="the bag's dim (the table's: DIM)")
args = parser.parse_args()

gt.init()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = head()
        self.bag = gt.EmbeddingBag("t", args.dim, mode=args.mode)

    def forward(self, ids):
        return self.fc(self.bag(ids))


model = Model()
opt = gt.DistributedOptimizer(model.named_parameters())
gt.broadcast_parameters(model)


def all_rows():
    rows = torch.empty((IDS, DIM), dtype=torch.float32)
    opt.worker.pull_rows("t", torch.arange(IDS, dtype=torch.int64).numpy(), rows.numpy())
    return rows


init_rows = all_rows() if gt.rank() == 0 else None
share = BAGS // gt.size()
while gt.step() < args.steps:
    ids, y = batch(gt.step(), gt.rank() * share, share)
    loss = F.cross_entropy(model(ids), y)
    opt.zero_grad()
    loss.backward()
    opt.step(samples=share)
    if args.pace_ms:
        time.sleep(args.pace_ms / 1000)
if args.out:
    torch.save({"init": init_rows, "final": all_rows(),
                "head": {n: p.detach().clone() for n, p in model.fc.named_parameters()}},
               args.out)
gt.done(test_accuracy=0.0)
