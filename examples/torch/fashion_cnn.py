"""A small CNN on Fashion-MNIST, trained on grps servers (docs/pytorch.md).

    grps-local --entry "python3 examples/torch/fashion_cnn.py" --servers 2 --workers 2 \
        --optimizer momentum --lr 0.05

Each worker trains on its share of the training set (gt.partition); the
optimizer and the consistency mode are the job's. The loop goes by the job's
step (gt.step()), not a count of its own: a rank started again for its rank
(grps-local --restart_workers) resumes where the job is, with the batches an
undisturbed run takes there, and stops at the job's last step; after a
roll-back it trains the same batches again. Reads the data of Debian's
dataset-fashion-mnist package (or --data DIR with the four IDX files).
--device cuda trains the model on the GPU (the data is moved there once).
"""

import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import grps.torch as gt


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s is not an IDX file of unsigned bytes" % path)
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, kind):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
        raise FileNotFoundError("no %s(.gz) in %s" % (stem, folder))
    prefix = "train" if kind == "train" else "t10k"
    images = read_idx(find(prefix + "-images-idx3-ubyte"))
    labels = read_idx(find(prefix + "-labels-idx1-ubyte"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def evaluate(model, x, y, batch=1000):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(x[i:i + batch])
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x), loss / len(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="examples per worker per step")
    parser.add_argument("--train_limit", type=int, default=0, help="0: the whole training set")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--eval_every", type=int, default=0,
                        help="evaluate every N steps as well as at each epoch's end "
                             "(rank 0; into the curve scripts/grps-compare reads); 0: epochs only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    gt.init()
    torch.manual_seed(args.seed)
    model = Net().to(device)
    opt = gt.DistributedOptimizer(model.named_parameters())
    gt.broadcast_parameters(model)

    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "test")
    if args.train_limit:
        x_train, y_train = x_train[:args.train_limit], y_train[:args.train_limit]
    share = gt.partition(len(x_train))
    x_mine = x_train[share.start:share.stop].to(device)
    y_mine = y_train[share.start:share.stop].to(device)
    x_test, y_test = x_test.to(device), y_test.to(device)
    steps_per_epoch = len(x_mine) // args.batch
    # The job's steps (unless the job sets --steps): its progress and ETA,
    # and where a restarted rank stops.
    total = gt.set_total_steps(args.epochs * steps_per_epoch)
    print("rank %d of %d: %d examples, %d steps per epoch, mode %s, on %s, from step %d of %d"
          % (gt.rank(), gt.size(), len(x_mine), steps_per_epoch, gt.mode(), device,
             gt.step(), total), flush=True)
    started = time.time()
    acc = test_loss = None
    order_of = None  # (epoch, that epoch's order of this rank's examples)
    while gt.step() < total:
        step = gt.step()
        epoch, s = divmod(step, steps_per_epoch)
        if order_of is None or order_of[0] != epoch:
            # Each epoch's order from a seed of its own, so that a rank that
            # resumes mid-job takes the batches an undisturbed run takes.
            g = torch.Generator().manual_seed((args.seed * 1000 + gt.rank()) * 1000 + epoch)
            order_of = (epoch, torch.randperm(len(x_mine), generator=g).to(device))
        idx = order_of[1][s * args.batch:(s + 1) * args.batch]
        loss = F.cross_entropy(model(x_mine[idx]), y_mine[idx])
        opt.zero_grad()
        loss.backward()
        opt.step(samples=len(idx))
        if s % 50 == 0:
            gt.report(loss=loss.item())
        if gt.step() > step and gt.step() // steps_per_epoch > epoch:  # the epoch's end
            acc, test_loss = evaluate(model, x_test, y_test)
            gt.report(test_accuracy=acc, test_loss=test_loss)
            print("rank %d epoch %d: test accuracy %.4f loss %.4f (%.0f s)"
                  % (gt.rank(), epoch + 1, acc, test_loss, time.time() - started), flush=True)
        elif args.eval_every and gt.rank() == 0 and gt.step() % args.eval_every == 0:
            acc, test_loss = evaluate(model, x_test, y_test)
            gt.report(test_accuracy=acc, test_loss=test_loss)
    if acc is None:  # resumed at the job's end: nothing trained here
        acc, test_loss = evaluate(model, x_test, y_test)
    gt.done(test_accuracy=acc, test_loss=test_loss,
            evaluate=lambda: evaluate(model, x_test, y_test))


if __name__ == "__main__":
    main()
