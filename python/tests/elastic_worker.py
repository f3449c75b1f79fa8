"""A Horovod-style script whose data comes from gt.ElasticSampler, as a
DataLoader's sampler: in an elastic job (--max_workers) the coordinator's
example ledger leases it its blocks, in a fixed job it is a
DistributedSampler. Trains --epochs epochs of batches of the job's --batch
with SGD (momentum) whose lr a StepLR divides by 10 each epoch (so that the
final accuracy is steady from run to run), then evaluates the final
weights.

--examples: a line per step, written before the step's push (a drained
worker leaves inside its last step()): "EPOCH STEP INDEX ..." of the
examples the step trained. --accuracy: the final test accuracy (rank 0).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import grps.torch as gt
import horovod_worker

TRAIN, TEST = 4096, 4096


def datasets():
    """The training set (with each example's index) and the test set: 4
    classes a fixed linear teacher gives."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(TRAIN + TEST, 20, generator=g)
    y = (x @ torch.randn(20, 4, generator=g)).argmax(1)
    train = torch.utils.data.TensorDataset(x[:TRAIN], y[:TRAIN], torch.arange(TRAIN))
    return train, (x[TRAIN:], y[TRAIN:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="the job's --batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--pace_ms", type=float, default=0,
                        help="sleep after each step (a job slow enough to join and leave)")
    parser.add_argument("--pace_until", default="",
                        help="sleep --pace_ms after each step only until this file exists")
    parser.add_argument("--examples", required=True)
    parser.add_argument("--accuracy", default="")
    args = parser.parse_args()
    gt.init()
    # One seed for every rank: a worker that joins the running job takes its
    # weights from the servers, but its buffers (Net's "shift") are its own.
    torch.manual_seed(100)
    torch.set_num_threads(1)
    train, (test_x, test_y) = datasets()
    model = horovod_worker.Net()
    opt = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = gt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    sampler = gt.ElasticSampler(train, batch_size=args.batch)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch, sampler=sampler)
    with open(args.examples, "w") as log:
        for _ in range(args.epochs):
            for x, y, index in loader:
                log.write("%d %d %s\n" % (sampler.epoch, gt.step(),
                                          " ".join(str(i) for i in index.tolist())))
                log.flush()
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if args.pace_ms and not (args.pace_until and os.path.exists(args.pace_until)):
                    time.sleep(args.pace_ms / 1000)
            scheduler.step()
    with torch.no_grad():
        accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    print("trained to step %d; test accuracy %.4f" % (gt.step(), accuracy), flush=True)
    if args.accuracy and gt.rank() == 0:
        with open(args.accuracy, "w") as f:
            f.write("%.6f\n" % accuracy)
    gt.done(test_accuracy=accuracy)


if __name__ == "__main__":
    main()
