"""grps: a gRPC parameter server for training (docs/pytorch.md).

``import grps.torch as gt`` trains a PyTorch model on grps servers;
``grps.JobClient`` reads a job's status from a script.
"""

import json as _json

from grps import _grps
from grps._grps import Error, JobEnded, ModelMismatch

__all__ = ["Error", "JobEnded", "ModelMismatch", "JobClient"]


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
