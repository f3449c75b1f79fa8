"""A model with a grps sparse table (gt.EmbeddingBag) and a dense head, its
data, and the same model in one plain PyTorch process."""

import torch
import torch.nn as nn
import torch.nn.functional as F

IDS = 50        # ids 0..49 of a table with no row bound
DIM = 4
BAGS = 16       # bags per step, over all workers
BAG = 3         # ids per bag


def batch(step, begin, count):
    g = torch.Generator().manual_seed(500 + step)
    ids = torch.randint(0, IDS, (BAGS, BAG), generator=g)
    y = torch.randint(0, 3, (BAGS,), generator=g)
    return ids[begin:begin + count], y[begin:begin + count]


def head():
    torch.manual_seed(0)
    return nn.Linear(DIM, 3)


def reference(init_rows, steps, lr, mode):
    fc = head()
    bag = nn.EmbeddingBag(IDS, DIM, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(init_rows)
    opt = torch.optim.SGD(list(fc.parameters()) + [bag.weight], lr=lr)
    for step in range(steps):
        ids, y = batch(step, 0, BAGS)
        loss = F.cross_entropy(fc(bag(ids)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return bag.weight.detach().clone(), {n: p.detach().clone() for n, p in fc.named_parameters()}
