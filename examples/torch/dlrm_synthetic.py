"""Embedding tables on grps servers + an MLP, trained from PyTorch, on
synthetic click data whose optimum is known (docs/pytorch.md).

    grps-local --entry "python3 examples/torch/dlrm_synthetic.py" --servers 2 --workers 2 \
        --sparse_tables ids:10000000:16 --optimizer adagrad --lr 0.2

Each example reads --features ids out of a table of --rows rows (10 million by
default); the ids that occur are --active rows spread over the whole id space.
Every active row has a hidden weight, and an example is a click when the sum
of its rows' weights is positive, flipped with probability --noise: the best
any model can do (the Bayes accuracy) is 1 - noise. The table lives on the
servers, its rows created as they are first read; a worker holds only the
rows of its batch, and prints its peak RSS beside the table's size.
"""

import argparse
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import grps.torch as gt


def make_data(args, count, seed):
    rng = np.random.default_rng(seed)
    # Active rows spread over [0, rows): a stride coprime with rows.
    stride = 7919 if args.rows % 7919 else 7907
    active = (np.arange(args.active, dtype=np.int64) * stride + 13) % args.rows
    weight = np.random.default_rng(args.seed).standard_normal(args.active)
    pick = rng.integers(0, args.active, size=(count, args.features))
    clean = (weight[pick].sum(1) > 0).astype(np.int64)
    flip = rng.random(count) < args.noise
    labels = np.where(flip, 1 - clean, clean)
    # The Bayes classifier (the clean label) on exactly these examples.
    bayes = float((labels == clean).mean())
    return torch.from_numpy(active[pick]), torch.from_numpy(labels), bayes


class ClickModel(nn.Module):
    def __init__(self, table, dim, hidden):
        super().__init__()
        self.bag = gt.EmbeddingBag(table, dim, mode="sum")
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, 2)

    def forward(self, ids):
        return self.fc2(F.relu(self.fc1(self.bag(ids))))


def evaluate(model, x, y, batch=4096):
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    return correct / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default="ids")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--active", type=int, default=5000)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--train", type=int, default=600000)
    p.add_argument("--test", type=int, default=20000)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)

    gt.init()
    torch.manual_seed(args.seed)
    model = ClickModel(args.table, args.dim, args.hidden)
    opt = gt.DistributedOptimizer(model.named_parameters())
    gt.broadcast_parameters(model)

    x, y, _ = make_data(args, args.train, args.seed + 1)
    x_test, y_test, bayes = make_data(args, args.test, args.seed + 2)
    share = gt.partition(len(x))
    x, y = x[share.start:share.stop], y[share.start:share.stop]
    steps_per_epoch = len(x) // args.batch
    # By the job's step (docs/pytorch.md): a restarted rank resumes where the
    # job is, with the batches an undisturbed run takes, and stops at its end.
    total = gt.set_total_steps(args.epochs * steps_per_epoch)
    started = time.time()
    acc = None
    order_of = None  # (epoch, that epoch's order of this rank's examples)
    while gt.step() < total:
        step = gt.step()
        epoch, s = divmod(step, steps_per_epoch)
        if order_of is None or order_of[0] != epoch:
            g = torch.Generator().manual_seed((args.seed * 100 + gt.rank()) * 1000 + epoch)
            order_of = (epoch, torch.randperm(len(x), generator=g))
        idx = order_of[1][s * args.batch:(s + 1) * args.batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step(samples=len(idx))
        if s % 50 == 0:
            gt.report(loss=loss.item())
        if gt.step() > step and gt.step() // steps_per_epoch > epoch:  # the epoch's end
            acc = evaluate(model, x_test, y_test)
            print("rank %d epoch %d: test accuracy %.4f (Bayes accuracy %.4f) %.0f s"
                  % (gt.rank(), epoch + 1, acc, bayes, time.time() - started), flush=True)
    if acc is None:  # resumed at the job's end: nothing trained here
        acc = evaluate(model, x_test, y_test)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    table_mib = args.rows * args.dim * 4 / 2**20
    print("rank %d: peak RSS %.0f MiB; the table is %.0f MiB (%d rows x %d floats), held by "
          "the servers" % (gt.rank(), peak_mib, table_mib, args.rows, args.dim), flush=True)
    gt.done(test_accuracy=acc, test_loss=-1, evaluate=lambda: (evaluate(model, x_test, y_test), -1))


if __name__ == "__main__":
    main()
