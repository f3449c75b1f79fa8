"""A small CNN grps has never seen, with what a real model has: a
convolution, linear layers, a 0-dim parameter, a frozen layer and a layer
that is never used; and its deterministic data."""

import torch
import torch.nn as nn
import torch.nn.functional as F

GLOBAL_BATCH = 64


class OddCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.frozen = nn.Linear(8, 8)
        self.frozen.weight.requires_grad_(False)
        self.frozen.bias.requires_grad_(False)
        self.scale = nn.Parameter(torch.tensor(0.5))   # 0-dim
        self.fc = nn.Linear(4 * 6 * 6 + 8, 10)
        self.unused = nn.Linear(3, 3)                  # never called: no gradient

    def forward(self, x):
        h = F.relu(self.conv(x)) * self.scale
        side = torch.tanh(self.frozen(x[:, 0, 0, :]))
        return self.fc(torch.cat([h.flatten(1), side], 1))


def make_model():
    torch.manual_seed(0)
    return OddCnn()


def batch(step, begin, count):
    """Examples [begin, begin + count) of step's global batch."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)
    return x[begin:begin + count], y[begin:begin + count]


def reference(steps, lr):
    """One PyTorch process, the whole batch, plain SGD: the weights after
    `steps` steps, by name."""
    model = make_model()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for step in range(steps):
        x, y = batch(step, 0, GLOBAL_BATCH)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}
