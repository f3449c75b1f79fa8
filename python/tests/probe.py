"""Bad-input probes: each prints one line "KIND: <exception type>: <message>"."""

import sys

import torch
import torch.nn as nn

import grps
import grps.torch as gt


def report(kind, f):
    try:
        f()
        print("%s: no exception" % kind, flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports whatever it got
        print("%s: %s: %s" % (kind, type(e).__name__, e), flush=True)


def join(model):
    gt.DistributedOptimizer(model.named_parameters())


def other_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 10))


which = sys.argv[1]
if which == "mismatch":
    gt.init()
    report("MISMATCH", lambda: join(other_model()))
elif which == "job_id":
    gt.init(job_id="not-this-job")
    report("JOB_ID", lambda: join(other_model()))
elif which == "token":
    gt.init(register_timeout_s=5)
    report("TOKEN", lambda: join(other_model()))
elif which == "local":
    gt.init(coordinator="127.0.0.1:1")  # nothing is dialled: the model is refused first
    m = other_model().double()
    report("DTYPE", lambda: join(m))
    meta = nn.Linear(4, 4, device="meta")
    report("DEVICE", lambda: join(meta))
