"""gt.Embedding and gt.EmbeddingBag compute what nn.Embedding and
nn.EmbeddingBag compute (forward and the rows' gradients), with the rows
given locally instead of pulled (no job); they refuse what nn.Embedding
refuses (ids that are not integers), and a dim other than their table's as
soon as the job's tables are known."""

import re
import unittest

import torch
import torch.nn as nn

import grps._torch
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


class JoinedWorker:
    """What a module made after the worker joined sees of the job: its
    sparse tables, as --sparse_tables=t:100:4 declares them."""
    tables = [("t", 100, 4)]


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

    def test_ids_of_a_non_integer_dtype_are_refused_naming_it(self):
        # nn.Embedding raises RuntimeError for these; truncating 1.5 to row
        # 1 would read a row the program did not name.
        for dtype in (torch.float32, torch.float64, torch.bool, torch.complex64):
            ids = torch.ones(2, dtype=dtype)
            with self.assertRaises(RuntimeError):
                nn.Embedding(4, 3)(ids)
            pattern = r"gt.Embedding\('t', 3\): ids must be of an integer dtype, not " + \
                re.escape(str(dtype))
            with self.assertRaisesRegex(RuntimeError, pattern):
                gt.Embedding("t", 3)(ids)
            with self.assertRaisesRegex(RuntimeError, re.escape(str(dtype))):
                gt.EmbeddingBag("t", 3)(ids.reshape(1, 2))

    def test_a_dim_other_than_the_tables_is_refused_when_made_after_the_worker_joined(self):
        process = grps._torch._process
        process.worker = JoinedWorker()
        try:
            with self.assertRaisesRegex(ValueError, re.escape(
                    "gt.Embedding('t', 8): table 't' has rows of 4 floats "
                    "(--sparse_tables t:100:4)")):
                gt.Embedding("t", 8)
            gt.Embedding("t", 4)  # the table's dim
        finally:
            process.worker = None


if __name__ == "__main__":
    unittest.main()
