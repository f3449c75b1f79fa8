"""gt.Embedding and gt.EmbeddingBag compute what nn.Embedding and
nn.EmbeddingBag compute (forward and the rows' gradients), with the rows
given locally instead of pulled (no job)."""

import unittest

import torch
import torch.nn as nn

import grps.torch as gt


def local(module, table):
    """`module` reading its rows from `table` (a tensor) instead of a job."""
    def rows(ids):
        flat = ids.reshape(-1).to(torch.int64)
        unique, inverse = torch.unique(flat, return_inverse=True)
        r = table[unique].clone().requires_grad_(True)
        module._pending.append((unique, r))
        return r, inverse
    module._rows = rows
    return module


class Pushed:
    def push_rows(self, table, ids, grads):
        self.ids, self.grads = torch.from_numpy(ids.copy()), torch.from_numpy(grads.copy())


class LocalRows(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        gt.init(coordinator="127.0.0.1:1")  # nothing is dialled here

    def compare(self, ours, theirs, *inputs):
        out = ours(*inputs)
        want = theirs(*inputs)
        self.assertTrue(torch.allclose(out, want, atol=1e-6))
        out.pow(2).sum().backward()
        want.pow(2).sum().backward()
        pushed = Pushed()
        ours._push(pushed)
        dense = torch.zeros_like(theirs.weight)
        dense[pushed.ids] = pushed.grads
        self.assertTrue(torch.allclose(dense, theirs.weight.grad, atol=1e-5))

    def test_bags_of_two_dim_ids_and_of_offsets(self):
        torch.manual_seed(3)
        for mode in ("sum", "mean"):
            theirs = nn.EmbeddingBag(20, 5, mode=mode)
            table = theirs.weight.detach()
            ids = torch.randint(0, 20, (6, 4))
            self.compare(local(gt.EmbeddingBag("t", 5, mode=mode), table), theirs, ids)
            theirs.zero_grad()
            flat = torch.randint(0, 20, (11,))
            offsets = torch.tensor([0, 3, 3, 7])  # an empty bag too
            self.compare(local(gt.EmbeddingBag("t", 5, mode=mode), table), theirs, flat, offsets)

    def test_embedding_and_a_row_read_twice_in_a_step(self):
        torch.manual_seed(4)
        theirs = nn.Embedding(10, 3)
        ours = local(gt.Embedding("t", 3), theirs.weight.detach())
        ids = torch.tensor([[1, 2, 2], [9, 1, 0]])
        a, b = ours(ids), ours(ids[:, :2])
        want = theirs(ids).pow(2).sum() + theirs(ids[:, :2]).pow(2).sum()
        (a.pow(2).sum() + b.pow(2).sum()).backward()
        want.backward()
        pushed = Pushed()
        ours._push(pushed)
        self.assertEqual(pushed.ids.tolist(), [0, 1, 2, 9])
        dense = torch.zeros_like(theirs.weight)
        dense[pushed.ids] = pushed.grads
        self.assertTrue(torch.allclose(dense, theirs.weight.grad, atol=1e-5))


if __name__ == "__main__":
    unittest.main()
