"""A DLRM-style click model on Criteo-shaped data, its 26 embedding tables
on grps servers (docs/sparse.md, "Criteo-shaped data").

    build/bin/grps-criteo-gen --train_out=/tmp/criteo/train.tsv.gz --train_examples=1000000 \\
        --test_out=/tmp/criteo/test.tsv.gz --test_examples=100000 \\
        --truth_json=/tmp/criteo/truth.json
    build/bin/grps-local --servers 2 --workers 2 --optimizer adagrad --lr 0.05 \\
        --sparse_tables "$(PYTHONPATH=build/python /usr/bin/python3 \\
                           examples/torch/dlrm_criteo.py --print_tables)" \\
        --entry "/usr/bin/python3 examples/torch/dlrm_criteo.py \\
                 --train /tmp/criteo/train.tsv.gz --test /tmp/criteo/test.tsv.gz \\
                 --truth /tmp/criteo/truth.json"

The model (Naumov et al., 2019): the 13 dense features through a bottom
MLP to a vector of --dim; each of the 26 categorical features through its
own table C1..C26 (gt.Embedding, rows created on first use; ids are 32-bit
hashes, a missing value its own id); the dot products of every pair of the
27 vectors, beside the dense vector, through a top MLP to one logit. With
--first_order 1 each row has one value more, the value's own weight, and
the logit adds those of the example's 26 values and a linear term of the
dense features (the wide part of Wide & Deep, a factorization machine's
first order). Off by default: on the generator's 10,000,000 examples it
is worth 0.0003 to 0.0007 of test AUC (0.9164 against 0.9157 in sync;
docs/sparse.md). Each
worker streams its share of the training file (grps.criteo: lines i with
i % workers == rank), in file order, --epochs times; the test file is read
whole. The result: test AUC and log loss (the field's measures), beside the
best any model can reach on the data (the generator's truth.json).
"""

import argparse
import json
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import grps.criteo
import grps.torch as gt


def table_flag(dim, options=""):
    """--sparse_tables for the 26 tables: any int64 id, --dim floats a row."""
    return ",".join("C%d:0:%d%s" % (j + 1, dim, options) for j in range(grps.criteo.TABLES))


def mlp(sizes, last_relu):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Dlrm(nn.Module):
    """`embedding(j, dim)`: table j's module (default: grps table C<j+1>)."""

    def __init__(self, dim, bottom, top, embedding=None, first_order=False):
        super().__init__()
        embedding = embedding or (lambda j, d: gt.Embedding("C%d" % (j + 1), d))
        self.dim = dim
        # With first_order a row is its vector and then its value's weight.
        width = dim + 1 if first_order else dim
        self.tables = nn.ModuleList(embedding(j, width) for j in range(grps.criteo.TABLES))
        self.bottom = mlp([grps.criteo.DENSE] + bottom + [dim], last_relu=True)
        self.linear = nn.Linear(grps.criteo.DENSE, 1) if first_order else None
        vectors = grps.criteo.TABLES + 1
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)
        self.top = mlp([dim + self.pairs.shape[1]] + top + [1], last_relu=False)

    def forward(self, dense, ids):
        x = self.bottom(dense)
        rows = [t(ids[:, j]) for j, t in enumerate(self.tables)]
        vectors = torch.stack([x] + [r[:, :self.dim] for r in rows], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        logit = self.top(torch.cat([x, dots], dim=1)).squeeze(1)
        if self.linear is not None:
            logit = logit + self.linear(dense).squeeze(1) + sum(r[:, self.dim] for r in rows)
        return logit


def auc(scores, labels):
    """The area under the ROC curve (ties count one half); -1 without both
    classes."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based, ties averaged
    pos = float(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return -1.0
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def evaluate(model, test, batch=8192):
    """(accuracy at 0.5, log loss, AUC) on the whole test set."""
    labels, dense, ids = test
    logits = []
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            logits.append(model(dense[i:i + batch], ids[i:i + batch]))
    logit = torch.cat(logits)
    loss = F.binary_cross_entropy_with_logits(logit, labels).item()
    acc = ((logit > 0).float() == labels).float().mean().item()
    return acc, loss, auc(logit.numpy(), labels.numpy())


def read_all(path):
    parts = list(grps.criteo.batches(path, 0, 1, 65536))
    return tuple(torch.from_numpy(np.concatenate([p[k] for p in parts])) for k in range(3))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", help="the training file (Criteo TSV, plain or gzip)")
    p.add_argument("--test", help="the test file")
    p.add_argument("--truth", default="", help="grps-criteo-gen's truth.json (the best AUC)")
    p.add_argument("--examples", type=int, default=0,
                   help="examples in the training file (default: truth.json's)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--first_order", type=int, default=0,
                   help="1: each value's own weight and a linear term of the dense "
                        "features in the logit (a row is --dim + 1 floats); 0: DLRM alone")
    p.add_argument("--bottom", default="64,32", help="the bottom MLP's hidden sizes")
    p.add_argument("--top", default="64,32", help="the top MLP's hidden sizes")
    p.add_argument("--batch", type=int, default=1024, help="examples per worker per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the epochs)")
    p.add_argument("--eval_every", type=int, default=0, help="steps between evaluations")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--print_tables", action="store_true",
                   help="print the job's --sparse_tables for --dim and exit")
    p.add_argument("--table_options", default="",
                   help="with --print_tables: options for every table, e.g. "
                        "rowwise_adagrad=1:max_rows=100000:eviction=lfu")
    args = p.parse_args()
    if args.print_tables:
        print(table_flag(args.dim + (1 if args.first_order else 0),
                         ":" + args.table_options if args.table_options else ""))
        return
    if not args.train or not args.test:
        p.error("--train and --test are needed")
    truth = json.load(open(args.truth)) if args.truth else {}
    examples = args.examples or truth.get("train", {}).get("examples", 0)
    if examples <= 0:
        p.error("--examples is needed without a truth.json")
    torch.set_num_threads(1)

    gt.init()
    torch.manual_seed(args.seed)
    sizes = lambda s: [int(v) for v in s.split(",") if v]
    model = Dlrm(args.dim, sizes(args.bottom), sizes(args.top), first_order=args.first_order)
    opt = gt.DistributedOptimizer(model.named_parameters())
    gt.broadcast_parameters(model)
    test = read_all(args.test)

    # Every rank takes the same number of steps an epoch: its share's
    # smallest size in whole batches (the rest of a share is not read).
    steps_per_epoch = (examples // gt.size()) // args.batch
    if steps_per_epoch == 0:
        p.error("fewer than --batch examples per worker")
    steps = args.epochs * steps_per_epoch
    total = gt.set_total_steps(min(steps, args.steps) if args.steps else steps)
    started = time.time()
    figures = None
    stream = None  # (epoch, this epoch's batches of this rank's share)
    while gt.step() < total:
        step = gt.step()
        epoch, s = divmod(step, steps_per_epoch)
        if stream is None or stream[0] != epoch:
            stream = (epoch, grps.criteo.batches(args.train, gt.rank(), gt.size(), args.batch))
            for _ in range(s):  # a rank that resumes mid-epoch skips what the job took
                next(stream[1])
        labels, dense, ids = (torch.from_numpy(a) for a in next(stream[1]))
        loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step(samples=len(labels))
        if s % 50 == 0:
            gt.report(loss=loss.item())
        if args.eval_every and gt.step() % args.eval_every == 0 and gt.rank() == 0:
            figures = evaluate(model, test)
            gt.report(test_accuracy=figures[0], test_loss=figures[1], test_auc=figures[2])
            print("step %d: test AUC %.4f, log loss %.4f" % (gt.step(), figures[2], figures[1]),
                  flush=True)
    seconds = time.time() - started
    figures = evaluate(model, test)
    best = truth.get("test", {})
    print("rank %d: test AUC %.4f (best %s), log loss %.4f (best %s), accuracy %.4f; "
          "%d steps in %.1f s, %.0f examples/s; peak RSS %.0f MiB"
          % (gt.rank(), figures[2], best.get("best_auc", "?"), figures[1],
             best.get("best_logloss", "?"), figures[0], total, seconds,
             total * args.batch / max(seconds, 1e-9),
             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), flush=True)
    gt.done(test_accuracy=figures[0], test_loss=figures[1], test_auc=figures[2],
            evaluate=lambda: evaluate(model, test))


if __name__ == "__main__":
    main()
