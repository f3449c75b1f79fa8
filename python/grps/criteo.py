"""Criteo's click-log TSV, streamed (docs/sparse.md, "Criteo-shaped data").

``batches(path, rank, world, batch)`` yields this worker's share of a file
(the lines ``i`` with ``i % world == rank``) as numpy arrays::

    for labels, dense, ids in grps.criteo.batches("train.tsv.gz", gt.rank(), gt.size(), 2048):
        ...   # labels float32 (n,), dense float32 (n, 13), ids int64 (n, 26)

The file is read a buffer at a time (plain or gzip), so one of any size
reads in bounded memory; a malformed line raises ValueError naming the file
and line. Dense features arrive as log(1 + max(x, 0)) (0 when missing), a
categorical value as its 32-bit hash in an int64, a missing one as
``MISSING_ID``. ``grps-criteo-gen`` writes such files with a known best AUC.
"""

from grps import _grps

DENSE = 13
TABLES = 26
MISSING_ID = 1 << 32

__all__ = ["DENSE", "TABLES", "MISSING_ID", "batches"]


def batches(path, rank=0, world=1, batch=4096):
    """This rank's examples of ``path``, ``batch`` at a time (the last may
    be smaller), as (labels, dense, ids) numpy arrays, in file order."""
    reader = _grps.CriteoReader(path, rank, world)
    while True:
        part = reader.next(batch)
        if part is None:
            return
        yield part
