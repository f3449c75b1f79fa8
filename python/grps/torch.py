"""Train a PyTorch model on grps servers (docs/pytorch.md).

    import grps.torch as gt
    gt.init()                               # coordinator, token, rank from GRPS_*
    model = Net()
    opt = gt.DistributedOptimizer(model.named_parameters())
    gt.broadcast_parameters(model)          # the job's weights into the model
    gt.set_total_steps(steps)               # unless the job sets --steps
    while gt.step() < gt.total_steps():     # a restarted rank goes on where the job is
        x, y = batch(gt.step())             # gt.rank(), gt.size(), gt.partition(n)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    gt.done(test_accuracy=acc, test_loss=l)

A Horovod script runs with ``import grps.torch as hvd``: init, rank, size,
local_rank, local_size, DistributedOptimizer(opt, named_parameters=...),
broadcast_parameters (a state dict too), broadcast_optimizer_state,
allreduce and the other collectives for metrics, Compression and the
reduce ops have Horovod's names and meanings, with the differences
docs/pytorch.md lists.

The model's trainable parameters (``requires_grad``) become the job's dense
tensors, in ``named_parameters()`` order. The program's optimizer runs on
the servers where they have it (SGD, Adam, AdamW, Adagrad, each param
group's hyperparameters as its LR scheduler leaves them), on the workers
otherwise (RMSprop, a custom one: in sync over the gradients the servers
average); the consistency mode is the job's. Each
step() pushes the parameters' gradients (``p.grad``, as the user's code
left it: clipped or unscaled; with ``overlap="auto"``, the default, from
the second step where the first changed none of them, or ``True``, each as
soon as backward() has it) and leaves in the parameters the weights the mode serves
next. Float32 parameters on the CPU are views into
one flat array the pulls write into (no copy); others (CUDA, float16,
bfloat16) are copied from it after each step.
"""

from grps._grps import Error, JobEnded, ModelMismatch
from grps._torch import (
    Adasum, Average, Compression, DistributedOptimizer, ElasticSampler, Embedding, EmbeddingBag,
    Max, Min, Product, Sum, allgather, allgather_object, allreduce, allreduce_, barrier, broadcast,
    broadcast_, broadcast_object, broadcast_optimizer_state, broadcast_parameters, done,
    grouped_allreduce, grouped_allreduce_, init, is_initialized, join, local_rank, local_size,
    mode, partition, rank, report, set_total_steps, shutdown, size, state_dict, step,
    total_steps)

__all__ = [
    # the job and this worker
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "mode", "partition", "ElasticSampler", "step", "total_steps", "set_total_steps", "report",
    "done", "state_dict",
    # the model and its optimizer
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "Compression", "Embedding", "EmbeddingBag",
    # collectives for metrics and small tensors
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
    "allgather_object", "broadcast", "broadcast_", "broadcast_object", "barrier", "join",
    "Average", "Sum", "Min", "Max", "Product", "Adasum",
    # errors
    "Error", "JobEnded", "ModelMismatch",
]
