"""grps: a gRPC parameter server for training (docs/pytorch.md).

``import grps.torch as gt`` trains a PyTorch model on grps servers;
``grps.JobClient`` reads a job's status from a script; ``grps.LookupClient``
reads a job's sparse rows from a lookup service (grps-server --serve) for
inference.
"""

import json as _json

from grps import _grps
from grps._grps import Error, JobEnded, ModelMismatch

__all__ = ["Error", "JobEnded", "ModelMismatch", "JobClient", "LookupClient"]


class JobClient:
    """The status of a grps job, as ``grpsctl status`` shows it.

    ``address`` is the coordinator's host:port; ``token`` the job's admin
    or worker token (default: GRPS_TOKEN / GRPS_WORKER_TOKEN). TLS comes
    from the GRPS_TLS_* variables, as for every grps process.
    """

    def __init__(self, address, token=None, timeout_s=10.0):
        self.address = address
        self.timeout_s = timeout_s
        _grps.configure({"token": token or ""})

    def status(self):
        """The coordinator's JobStatus as a dict (proto field names):
        state, message, config, workers, shards, global_step, ..."""
        return _json.loads(_grps.job_status_json(self.address, self.timeout_s))


class LookupClient:
    """Rows of a job's sparse tables, for inference, from a lookup service
    (``grps-server --serve --checkpoint_dir=...``; docs/sparse.md).

    ``address`` is the service's host:port; ``token`` the job's worker or
    admin token (default: GRPS_WORKER_TOKEN / GRPS_TOKEN). TLS comes from
    the GRPS_TLS_* variables, as for every grps process.

        client = grps.LookupClient("10.0.0.5:7075")
        rows = client.lookup("emb", ids)  # numpy float32, len(ids) x dim

    A row the table does not have (never trained, not yet admitted, or
    evicted) is zeros; ``last_missing`` holds the positions of those of the
    last lookup, ``last_checkpoint`` the checkpoint it answered from.
    """

    def __init__(self, address, token=None, timeout_s=10.0):
        self.address = address
        _grps.configure({"worker_token": token} if token else {})
        self._client = _grps.LookupClient(address, timeout_s)
        self.last_missing = None
        self.last_checkpoint = None

    def lookup(self, table, ids):
        """The rows of ``ids`` (int64, 1-d) in ``table``: a float32 numpy
        array of len(ids) x the table's dim. Raises grps.Error with the
        service's status (UNAVAILABLE before it serves a checkpoint,
        NOT_FOUND for a table the job lacks)."""
        rows, missing, checkpoint, _step = self._client.lookup(table, ids)
        self.last_missing = missing
        self.last_checkpoint = checkpoint
        return rows

    def status(self):
        """What the service serves, as a dict (proto/lookup.proto's
        LookupStatusResponse): checkpoint_id, step, tables, ..."""
        return _json.loads(self._client.status_json())
