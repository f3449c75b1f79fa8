"""A worker whose program raises between backward() and step() at step 3,
with overlap on: backward() has started that step's pushes (each pulling
the next weights into the model) when the exception ends the program."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import grps.torch as gt

torch.manual_seed(0)
gt.init()
model = nn.Linear(4, 3)
opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              named_parameters=model.named_parameters(), overlap=True)
gt.set_total_steps(50)


def backward():
    opt.zero_grad()
    F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()


for _ in range(3):
    backward()
    opt.step(samples=8)
backward()
raise RuntimeError("raised between backward() and step()")
