"""A script with its own optimizer and LR scheduler, as a PyTorch user
writes one, on grps: `build(model, name, steps)` makes the optimizer and
scheduler of configuration `name` (the test builds the same for its one
process); the servers run the optimizer with each param group's
hyperparameters as the scheduler leaves them at each step.

Trains --steps steps of --batch examples per rank from rank 0's start
(broadcast_parameters) and writes the final state dict to --out. With
--save_at and --save, rank 0 torch.saves the training state (model,
optimizer, scheduler) at that step; --resume trains on from such a file
in a new job.
"""

import argparse

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import grps.torch as gt
import horovod_worker

OPTIMIZERS = ("sgd_groups", "adam", "adamw", "adagrad", "rmsprop", "custom")
SCHEDULES = ("step", "onecycle")
# Each optimizer under each schedule ("adam/onecycle"), and "halted".
CONFIGS = tuple("%s/%s" % (o, s) for o in OPTIMIZERS for s in SCHEDULES) + ("halted",)


class NormalizedMomentum(optim.Optimizer):
    """A program's own optimizer, which grps's servers do not have: heavy-ball
    momentum, each tensor's step lr times its velocity over the velocity's
    root mean square."""

    def __init__(self, params, lr=0.01, momentum=0.9, eps=1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                v = state["velocity"].mul_(g["momentum"]).add_(p.grad)
                rms = v.pow(2).mean().sqrt()
                p.add_(v / (rms + g["eps"]), alpha=-g["lr"])


def optimizer(model, name):
    """The torch optimizer `name` over `model`."""
    if name == "sgd_groups":
        # Two param groups, each its own lr, momentum, nesterov and weight decay.
        return optim.SGD([
            {"params": model.fc1.parameters(), "lr": 0.05, "nesterov": True,
             "weight_decay": 1e-3},
            {"params": model.fc2.parameters(), "lr": 0.02, "momentum": 0.8},
        ], lr=0.05, momentum=0.9)
    if name == "adam":
        return optim.Adam(model.parameters(), lr=0.01, betas=(0.85, 0.99), weight_decay=1e-4)
    if name == "adamw":
        return optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    if name == "adagrad":
        return optim.Adagrad(model.parameters(), lr=0.1, weight_decay=1e-3)
    # Those two run on the workers: grps's servers have neither.
    if name == "rmsprop":
        return optim.RMSprop(model.parameters(), lr=0.003, alpha=0.9, momentum=0.5,
                             weight_decay=1e-4)
    if name == "custom":
        return NormalizedMomentum([
            {"params": model.fc1.parameters(), "lr": 0.01},
            {"params": model.fc2.parameters(), "lr": 0.005, "momentum": 0.8},
        ])
    raise ValueError(name)


def build(model, name, steps):
    """The optimizer and scheduler of configuration `name` over `model`.

    "step": StepLR halves every group's lr every 10 steps. "onecycle":
    OneCycleLR moves every group's lr (up to twice its own, then down)
    every step, and SGD's momentum or Adam's beta1 with it (Adagrad has
    neither)."""
    if name == "halted":  # a LambdaLR that holds the lr at 0: nothing may move
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return opt, optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)
    kind, schedule = name.split("/")
    opt = optimizer(model, kind)
    if schedule == "step":
        return opt, optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    if schedule == "onecycle":
        return opt, optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[2 * g["lr"] for g in opt.param_groups], total_steps=steps,
            cycle_momentum=kind not in ("adagrad", "custom"))
    raise ValueError(name)


def batches(size, rank, batch, steps):
    """Rank `rank`'s batches: a DistributedSampler's share of the data."""
    data = horovod_worker.dataset(batch * size * steps)
    sampler = torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=size, rank=rank, shuffle=True, seed=5)
    return data, list(sampler)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", required=True)
    parser.add_argument("--report", action="store_true",
                        help="gt.report the loss each step and a test accuracy at the end")
    parser.add_argument("--save_at", type=int, default=0,
                        help="after this many steps, rank 0 torch.saves the training state "
                             "(model, optimizer, scheduler) to --save")
    parser.add_argument("--save", default="")
    parser.add_argument("--resume", default="",
                        help="a --save file: every rank loads it and trains on from its step")
    parser.add_argument("--load_before_wrap", action="store_true",
                        help="load the optimizer's state before gt.DistributedOptimizer wraps "
                             "it (default: after, Horovod's order)")
    parser.add_argument("--rank0_loads", action="store_true",
                        help="as Horovod's examples: only rank 0 reads --resume, and "
                             "broadcast_parameters and broadcast_optimizer_state give the "
                             "others its weights and hyperparameters")
    args = parser.parse_args()
    gt.init()
    torch.manual_seed(100 + gt.rank())
    torch.set_num_threads(1)
    model = horovod_worker.Net()
    opt, scheduler = build(model, args.config, args.steps)
    start, saved = 0, None
    if args.resume:
        saved = torch.load(args.resume)
        start = saved["step"]
        if args.rank0_loads and gt.rank() != 0:
            saved = None
        else:
            model.load_state_dict(saved["model"])
            scheduler.load_state_dict(saved["scheduler"])
            if args.load_before_wrap:
                opt.load_state_dict(saved["optimizer"])
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = gt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    if saved is not None and not args.load_before_wrap:
        opt.load_state_dict(saved["optimizer"])
    if args.rank0_loads:
        gt.broadcast_optimizer_state(opt, root_rank=0)
        lr = torch.load(args.resume)["optimizer"]["param_groups"][0]["lr"]
        if opt.param_groups[0]["lr"] != lr:
            raise SystemExit("rank %d's lr is %g after broadcast_optimizer_state, rank 0's %g"
                             % (gt.rank(), opt.param_groups[0]["lr"], lr))
    data, order = batches(gt.size(), gt.rank(), args.batch, args.steps)
    for i in range(start, args.steps):
        x, y = data[order[i * args.batch:(i + 1) * args.batch]]
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        scheduler.step()
        if args.report:
            gt.report(loss=loss.item())
        if i + 1 == args.save_at and gt.rank() == 0:
            torch.save({"step": i + 1, "model": model.state_dict(),
                        "optimizer": opt.state_dict(), "scheduler": scheduler.state_dict()},
                       args.save)
    torch.save(model.state_dict(), args.out)
    if args.report:
        gt.report(test_accuracy=0.5, test_loss=1.5)
    gt.done(test_accuracy=0.75 if args.report else None)


if __name__ == "__main__":
    main()
