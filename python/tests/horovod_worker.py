"""A Horovod-style training script (the pattern of Horovod's
examples/pytorch/pytorch_mnist.py) on grps, its import line the only
difference: the user's SGD with momentum and lr x size, a
DistributedSampler by rank and size, broadcast_parameters of the state dict
(a buffer included), broadcast_optimizer_state, DistributedOptimizer(opt,
named_parameters=..., compression=..., op=hvd.Average), metrics averaged by
hvd.allreduce, and no done(): the script just ends.

Each rank starts from weights and a buffer of its own seed: the broadcasts
make them rank 0's. Writes to --out (per rank) its final state dict, its
last loss and the averaged one, and prints "COLLECTIVES OK" once the other
collectives gave what they should (bool reductions included).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import grps.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--out", default="")
parser.add_argument("--done", action="store_true", help="end with hvd.done() (no figures)")
parser.add_argument("--scheduler", action="store_true", help="a StepLR that changes the lr")
parser.add_argument("--no_overlap", action="store_true",
                    help="overlap=False (without it, Horovod's call: the default, \"auto\")")
parser.add_argument("--clip", action="store_true",
                    help="Horovod's clipping: synchronize(), clip, step() in skip_synchronize()")
parser.add_argument("--optimizer", default="sgd", choices=("sgd", "rmsprop", "lbfgs"),
                    help="rmsprop runs on the workers; lbfgs cannot run on grps")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 4)
        self.register_buffer("shift", torch.randn(20))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x + self.shift)))


def dataset(n):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 20, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 1).long()) % 4
    return torch.utils.data.TensorDataset(x, y)


def refuses_with_type_error(call):
    """Whether call() raises TypeError (each rank raises before the
    collective, so the ranks' calls stay paired)."""
    try:
        call()
    except TypeError:
        return True
    return False


def main():
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(100 + hvd.rank())  # a rank's own start: the broadcasts decide
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
    data = dataset(args.batch * hvd.size() * args.steps)
    sampler = torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = Net()
    if args.optimizer == "rmsprop":
        optimizer = optim.RMSprop(model.parameters(), lr=args.lr * hvd.size())
    elif args.optimizer == "lbfgs":
        optimizer = optim.LBFGS(model.parameters(), lr=args.lr)
    else:
        optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                              momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none, op=hvd.Average,
                                         **({"overlap": False} if args.no_overlap else {}))
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=5) if args.scheduler else None
    sampler.set_epoch(0)
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if args.clip:
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)  # clips nothing
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    avg = hvd.allreduce(torch.tensor(losses[-1]), name="avg_loss")

    r, n = hvd.rank(), hvd.size()
    checks = {
        "sum": float(hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum)) == n * (n + 1) / 2,
        "max": float(hvd.allreduce(torch.tensor(float(r)), op=hvd.Max)) == n - 1,
        # Bools reduce as torch.distributed's do: Sum and Max are "any rank",
        # Min and Product "every rank"; their mean is no truth value.
        "bool_sum": hvd.allreduce(torch.tensor([r == 0, True]), op=hvd.Sum).tolist() ==
        [True, True],
        "bool_max": hvd.allreduce(torch.tensor([r == 0, False]), op=hvd.Max).tolist() ==
        [True, False],
        "bool_min": hvd.allreduce(torch.tensor([r == 0, True]), op=hvd.Min).tolist() ==
        [n == 1, True],
        "bool_product": hvd.allreduce(torch.tensor([r == 0, True]), op=hvd.Product).tolist() ==
        [n == 1, True],
        "bool_average_refused": refuses_with_type_error(
            lambda: hvd.allreduce(torch.tensor([r == 0, True]), op=hvd.Average)),
        "allgather": hvd.allgather(torch.full((r + 1, 2), r)).tolist() ==
        [[i, i] for i in range(n) for _ in range(i + 1)],
        "allgather_object": hvd.allgather_object({"rank": r}) == [{"rank": i} for i in range(n)],
        "broadcast_object": hvd.broadcast_object("from %d" % r, root_rank=n - 1) ==
        "from %d" % (n - 1),
        "broadcast": float(hvd.broadcast(torch.tensor(float(r)), root_rank=0)) == 0.0,
        "local": (hvd.local_rank(), hvd.local_size()) == (r, n),
    }
    hvd.barrier()
    failed = [k for k, ok in checks.items() if not ok]
    print("COLLECTIVES " + ("OK" if not failed else "FAILED: " + ", ".join(failed)), flush=True)
    if args.out:
        torch.save({"state": model.state_dict(), "last_loss": losses[-1], "avg_loss": float(avg),
                    "steps": len(losses), "overlap": optimizer.overlap}, args.out)
    if args.done:
        hvd.done()


if __name__ == "__main__":
    main()
