"""A worker whose loop is its own: it runs --steps steps from wherever it
starts, as a script that does not resume from gt.step() does. Started again
for its rank after a kill, it still runs its whole loop; grps stops it at
the job's last step (opt.step() raises grps.JobEnded), and it says where:

    START at step N        the step it resumed at
    ENDED at step N: ...   opt.step() refused a step past the job's end
"""

import argparse
import time

import torch.nn.functional as F

import grps.torch as gt
from odd_cnn import GLOBAL_BATCH, batch, make_model

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100, help="the loop's length")
parser.add_argument("--pace_ms", type=int, default=0, help="sleep before each step")
args = parser.parse_args()

gt.init()
model = make_model()
opt = gt.DistributedOptimizer(model.named_parameters())
gt.broadcast_parameters(model)
share = GLOBAL_BATCH // gt.size()
print("START at step %d" % gt.step(), flush=True)
try:
    for i in range(args.steps):
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000.0)
        opt.zero_grad()
        x, y = batch(i, gt.rank() * share, share)
        F.cross_entropy(model(x), y).backward()
        opt.step(samples=share)
except gt.JobEnded as e:
    print("ENDED at step %d: %s" % (gt.step(), e), flush=True)
gt.done(test_accuracy=0.0, test_loss=0.0)
