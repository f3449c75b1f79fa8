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

The model's trainable parameters (``requires_grad``) become the job's dense
tensors, in ``named_parameters()`` order; the optimizer (SGD, momentum, Adam,
...) and the consistency mode are the job's and run on the servers. Each
step() pushes the parameters' gradients (``p.grad``, as the user's code
left it: clipped or unscaled; with ``overlap=True``, each as soon as
backward() has it) and leaves in the parameters the weights the mode serves
next. Float32 parameters on the CPU are views into
one flat array the pulls write into (no copy); others (CUDA, float16,
bfloat16) are copied from it after each step.
"""

import math
import os
import signal
import sys
import threading

import numpy as np
import torch

from grps import _grps
from grps._grps import Error, JobEnded, ModelMismatch

__all__ = [
    "init", "rank", "size", "partition", "step", "total_steps", "set_total_steps", "mode",
    "DistributedOptimizer",
    "broadcast_parameters", "done", "state_dict", "Embedding", "EmbeddingBag",
    "Error", "JobEnded", "ModelMismatch",
]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class _Process:
    """What gt.init() set up, and the worker once the model is known."""

    def __init__(self, coordinator, rank, register_timeout_s, job_id):
        self.coordinator = coordinator
        self.job_id = job_id
        self.requested_rank = rank
        self.register_timeout_s = register_timeout_s
        self.worker = None
        self.model = None      # the _Model joined with
        self.begun = False
        self.tables = []       # gt.Embedding / gt.EmbeddingBag modules
        self.declared_steps = None  # set_total_steps before the worker joined


_process = None


def _env_int(name, default):
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (name, value)) from None


def init(coordinator=None, rank=None, token=None, tls_ca=None, tls_cert=None, tls_key=None,
         tls_server_name=None, register_timeout_s=None, job_id=None, leave_on_sigterm=True):
    """Sets up this process as a worker of a grps job.

    Every argument defaults to its GRPS_* variable, which grps-local and
    the Kubernetes manifests set: GRPS_COORDINATOR (host:port, default
    127.0.0.1:7070), GRPS_RANK (-1: any free rank), GRPS_JOB_ID (the job
    this worker is for; empty: whichever the coordinator runs),
    GRPS_WORKER_TOKEN (or
    GRPS_TOKEN), GRPS_TLS_CA, GRPS_TLS_CERT, GRPS_TLS_KEY,
    GRPS_TLS_SERVER_NAME, GRPS_REGISTER_TIMEOUT_S (120). The worker joins
    the job when the model is known (DistributedOptimizer).

    With ``leave_on_sigterm`` (and no SIGTERM handler of the program's own),
    SIGTERM, as Kubernetes sends when it scales the workers down, makes this
    worker leave the job after its step in progress: the next
    ``opt.step()`` pushes that step, tells the coordinator, and raises
    SystemExit(0). ``grpsctl drain RANK`` does the same. A second SIGTERM,
    or 20 s, interrupts at once.
    """
    global _process
    if _process is not None and _process.worker is not None:
        raise RuntimeError("gt.init(): this process already joined a job")
    _grps.configure({
        "worker_token": token or "",
        "tls_ca": tls_ca or "", "tls_cert": tls_cert or "", "tls_key": tls_key or "",
        "tls_server_name": tls_server_name or "",
    })
    coordinator = coordinator or os.environ.get("GRPS_COORDINATOR", "") or "127.0.0.1:7070"
    rank = _env_int("GRPS_RANK", -1) if rank is None else int(rank)
    if register_timeout_s is None:
        register_timeout_s = float(os.environ.get("GRPS_REGISTER_TIMEOUT_S", "") or 120)
    job_id = os.environ.get("GRPS_JOB_ID", "") if job_id is None else job_id
    _process = _Process(coordinator, rank, register_timeout_s, job_id)
    if (leave_on_sigterm and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        _grps.leave_on_sigterm()


def _require_process():
    if _process is None:
        raise RuntimeError("call gt.init() first")
    return _process


def _leave(p):
    """SIGTERM or a drain: this step was the last; the rank leaves the job."""
    p.worker.leave()
    print("grps: rank %d left the job after step %d" % (p.worker.rank, p.worker.step_count),
          file=sys.stderr, flush=True)
    raise SystemExit(0)


def _require_worker():
    p = _require_process()
    if p.worker is None:
        raise RuntimeError("this worker has not joined its job yet: create the "
                           "gt.DistributedOptimizer (or call gt.broadcast_parameters) first")
    return p.worker


def rank():
    """This worker's rank: GRPS_RANK before the worker joined, the rank the
    coordinator gave after."""
    p = _require_process()
    if p.worker is not None:
        return p.worker.rank
    if p.requested_rank >= 0:
        return p.requested_rank
    raise RuntimeError("the rank is given when the worker joins (set GRPS_RANK, or ask after "
                       "gt.DistributedOptimizer)")


def size():
    """The job's number of workers."""
    p = _require_process()
    if p.worker is not None:
        return p.worker.size
    workers = _env_int("GRPS_WORKERS", 0)
    if workers > 0:
        return workers
    return int(_job_status(p)["config"]["num_workers"])


def step():
    """The steps this worker has completed: the step its next opt.step()
    pushes. A restarted rank resumes at its step (in sync, the others'); a
    roll-back moves it back to the checkpoint's. A loop that takes its data
    by step (``while gt.step() < gt.total_steps()``) trains the same
    examples again after a roll-back, and a restarted rank's loop goes on
    where the job is."""
    return _require_worker().step_count


def total_steps():
    """The job's steps per worker: the job's --steps when it sets one, else
    the count given to set_total_steps(); None while neither says.
    opt.step() raises grps.JobEnded, pushing nothing, once gt.step() has
    reached it."""
    p = _require_process()
    if p.worker is None:
        return p.declared_steps
    return p.worker.total_steps or None


def set_total_steps(steps):
    """Declares how many steps this program trains (its loop's length), for
    a job that sets no --steps: the job's progress and ETA, the bound of its
    checkpoints, and where a restarted rank stops (opt.step() raises
    grps.JobEnded once gt.step() reaches it, whatever the program's loop
    does). Returns the job's count, which is the job's --steps when it sets
    one."""
    steps = int(steps)
    if steps < 1:
        raise ValueError("set_total_steps: the job's steps must be at least 1, not %d" % steps)
    p = _require_process()
    if p.worker is None:
        p.declared_steps = steps
        return steps
    return p.worker.set_total_steps(steps)


def mode():
    """The job's consistency mode: "sync", "async" or "ssp"."""
    return _require_worker().mode


def partition(n):
    """This worker's share of n examples, as grps-worker cuts its data: a
    range of consecutive indices, the first n % size() ranks one longer."""
    r, s = rank(), size()
    base, extra = divmod(int(n), s)
    begin = r * base + min(r, extra)
    return range(begin, begin + base + (1 if r < extra else 0))


def _job_status(p):
    import json
    return json.loads(_grps.job_status_json(p.coordinator, 10.0))


def _trainable(named_parameters):
    """The parameters that train, by their first name: frozen ones are the
    process's own, a tied one counts once."""
    names, params, seen = [], [], set()
    for name, p in named_parameters:
        if not isinstance(p, torch.Tensor):
            raise TypeError("named_parameters must yield (name, tensor) pairs")
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        names.append(name)
        params.append(p)
    return names, params


def _check_parameter(name, p, first):
    if p.dtype not in _DTYPES:
        raise ValueError("parameter '%s' is %s: the shards take float32, float16 and "
                         "bfloat16" % (name, p.dtype))
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError("parameter '%s' is on device %s: grps trains parameters on the "
                         "CPU or a CUDA device" % (name, p.device))
    if first is not None and p.device != first[1].device:
        raise ValueError("parameter '%s' is on %s, '%s' on %s: one device per model"
                         % (name, p.device, first[0], first[1].device))
    if p.is_sparse:
        raise ValueError("parameter '%s' is a sparse tensor: use gt.EmbeddingBag for "
                         "sparse rows" % name)


class _Model:
    """The trainable parameters as one flat float32 array (the job's dense
    layout), and how each parameter maps into it."""

    def __init__(self, named_parameters):
        self.names, self.params = _trainable(named_parameters)
        if not self.params:
            raise ValueError("the model has no parameter that trains (requires_grad)")
        for name, p in zip(self.names, self.params):
            _check_parameter(name, p, (self.names[0], self.params[0]))
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        device = self.params[0].device
        pin = device.type == "cuda" and torch.cuda.is_available()
        self.flat = torch.zeros(total, dtype=torch.float32, pin_memory=pin)
        self.grads = torch.zeros(total, dtype=torch.float32, pin_memory=pin)
        self.copied = []  # parameters that are not views of flat
        with torch.no_grad():
            for p, at in zip(self.params, self.offsets):
                view = self.flat[at:at + p.numel()]
                view.copy_(p.detach().reshape(-1))
                if p.dtype == torch.float32 and p.device.type == "cpu":
                    p.data = view.view(p.shape)  # the pulls write into the model
                else:
                    self.copied.append((p, view))

    def spec(self):
        return [(n, list(p.shape), _DTYPES[p.dtype]) for n, p in zip(self.names, self.params)]

    def same(self, other_named):
        return [id(p) for p in _trainable(other_named)[1]] == [id(p) for p in self.params]

    def weights_to_params(self):
        """After a pull: the parameters that are not views get the flat values."""
        with torch.no_grad():
            for p, view in self.copied:
                p.data.copy_(view.view(p.shape), non_blocking=False)

    def grad_view(self, i):
        at = self.offsets[i]
        return self.grads[at:at + self.params[i].numel()]

    def grad_from_param(self, i, passes):
        """Parameter i's gradient (zeros where it has none) into grads, as
        the mean over `passes` backward passes."""
        p, view = self.params[i], self.grad_view(i)
        with torch.no_grad():
            if p.grad is None:
                view.zero_()
                return
            if p.grad.is_sparse:
                raise ValueError("sparse gradients are not pushed: use gt.EmbeddingBag")
            view.copy_(p.grad.detach().reshape(-1))
            if passes > 1:
                view.div_(passes)

    def grads_from_params(self, passes, skip=()):
        """grad_from_param for every parameter not in `skip`."""
        for i in range(len(self.params)):
            if i not in skip:
                self.grad_from_param(i, passes)


def _join(named_parameters):
    p = _require_process()
    if p.worker is not None:
        if not p.model.same(named_parameters):
            raise ValueError("this process joined its job with other parameters; one model per "
                             "process")
        return p
    model = _Model(named_parameters)
    p.worker = _grps.Worker(p.coordinator, model.spec(), p.requested_rank,
                            p.register_timeout_s, p.job_id)
    p.model = model
    if p.declared_steps is not None:
        p.worker.set_total_steps(p.declared_steps)
    return p


def broadcast_parameters(model_or_named, root_rank=0):
    """The job's weights into the model: on a fresh job rank 0's own values
    become the job's initial weights (every other rank waits for them); on a
    job that runs (a restarted worker, a job resumed from a checkpoint) the
    job's current weights. Joins the job if the optimizer has not yet.
    Buffers (batch norm statistics) are not the job's: each process keeps
    its own."""
    if root_rank != 0:
        raise ValueError("grps takes the initial weights from rank 0")
    named = (model_or_named.named_parameters() if isinstance(model_or_named, torch.nn.Module)
             else model_or_named)
    p = _join(named)
    _begin(p)


def _begin(p):
    if p.begun:
        return
    w = p.worker
    w.begin(p.model.flat.numpy(), w.rank == 0)
    p.model.weights_to_params()
    p.begun = True


class DistributedOptimizer(torch.optim.Optimizer):
    """The job's optimizer, run on the servers: step() pushes the
    parameters' gradients and leaves in them the weights the mode serves
    next (sync: after every worker's gradient of this step; async: the
    newest; ssp: within the staleness bound).

    ``backward_passes_per_step``: backward passes whose gradients add up in
    ``p.grad`` before each step(); the step pushes their mean.

    ``overlap`` (default False): with True, each parameter's gradient is
    pushed as soon as autograd has accumulated it in the step's last
    backward pass (a hook per parameter), so the pushes overlap the rest of
    backward. Code that changes ``p.grad`` between backward() and step()
    (clipping, unscaling) must leave it False: step() raises grps.Error if a
    gradient it pushed early changed after; that is why it is not the
    default (docs/pytorch.md).
    """

    def __init__(self, named_parameters, backward_passes_per_step=1, overlap=False):
        named = list(named_parameters)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._process = _join(named)
        self._model = self._process.model
        self.backward_passes_per_step = int(backward_passes_per_step)
        super().__init__(self._model.params, {})
        # Read by the hooks at every call: may be changed between steps.
        self.overlap = bool(overlap)
        self._passes = [0] * len(self._model.params)  # hook calls this step, by parameter
        self._early = set()     # parameters pushed by their hook this step
        self._refused = None    # the first early gradient that was not finite
        self._hooks = []
        if self._process.worker.can_overlap:  # not with top-k
            for i, param in enumerate(self._model.params):
                self._hook(i, param)

    def _hook(self, i, param):
        # The hook of the node that accumulates the parameter's gradient: it
        # runs once p.grad holds the pass's sum (torch 1.13 has no
        # post-accumulate hook on the tensor itself; Horovod does the same).
        accumulate = param.expand_as(param).grad_fn.next_functions[0][0]
        accumulate.register_hook(lambda *unused: self._accumulated(i))
        self._hooks.append(accumulate)  # kept alive: the hook lives on it

    def _accumulated(self, i):
        self._passes[i] += 1
        if (not self.overlap or self._passes[i] != self.backward_passes_per_step
                or self._refused is not None):
            return
        p = self._process
        if not p.begun:
            # The job's first weights are pulled at step() (no
            # broadcast_parameters before): not into a model in backward.
            return
        model = self._model
        model.grad_from_param(i, self.backward_passes_per_step)
        try:
            p.worker.tensor_ready(i, model.grads.numpy(), model.flat.numpy())
        except ValueError as e:
            # Raised by step(), with the parameter's name: an exception here
            # would end backward() half-way.
            self._refused = _name_element(model, str(e))
            return
        self._early.add(i)

    @property
    def worker(self):
        return self._process.worker

    def zero_grad(self, set_to_none=True):
        for p in self._model.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, closure=None, samples=1):
        """Pushes this step's gradient (``samples``: the examples it came
        from, for the job's progress) and pulls the next weights. Raises
        ValueError for a gradient that is not finite (nothing pushed; with
        overlap, the gradients final before it were), grps.JobEnded once the
        job has ended or gt.step() has reached gt.total_steps() (nothing
        pushed: a restarted rank's program that runs its whole loop again
        stops at the job's last step)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        p = self._process
        _begin(p)
        model = self._model
        early, refused = self._early, self._refused
        self._passes = [0] * len(model.params)
        self._early, self._refused = set(), None
        if refused is not None:
            self._abandon()
            raise ValueError(refused)
        self._check_unchanged(early)
        model.grads_from_params(self.backward_passes_per_step, skip=early)
        # Checked before anything more is pushed, the rows of the sparse tables too.
        at = p.worker.first_non_finite(model.grads.numpy())
        if at >= 0:
            self._abandon()
            raise ValueError(_name_element(model, "element %d of step %d's gradient is %s: %s"
                                           % (at, p.worker.step_count, float(model.grads[at]),
                                              "it was not pushed, the gradients final before "
                                              "it were" if early else "nothing was pushed")))
        for table in p.tables:
            table._push(p.worker)
        try:
            outcome = p.worker.step(model.grads.numpy(), model.flat.numpy(), int(samples))
        except ValueError as e:
            raise ValueError(_name_element(model, str(e))) from None
        model.weights_to_params()
        if loss is not None:
            p.worker.report_loss(float(loss))
        self.last_outcome = outcome
        self.last_early = len(early)  # parameters whose hooks pushed them
        if p.worker.leave_requested():
            _leave(p)
        return loss


    def _abandon(self):
        """A refused step: the pushes its hooks started end (what they pushed
        stands, and their tensors may hold the next weights already), the
        rest is not pushed, and the step stays where it is."""
        self._process.worker.abandon_step()
        self._model.weights_to_params()

    def _check_unchanged(self, early):
        """A gradient pushed by its hook that the program changed before
        step() (clipping, unscaling) would train with the old one: refused."""
        model = self._model
        with torch.no_grad():
            for i in early:
                param, passes = model.params[i], self.backward_passes_per_step
                now = (torch.zeros(param.numel()) if param.grad is None
                       else param.grad.detach().reshape(-1).to("cpu", torch.float32))
                if passes > 1:
                    now = now / passes
                if not torch.equal(now, model.grad_view(i)):
                    self._abandon()
                    raise Error("the gradient of parameter '%s' changed between backward() "
                                "and step(), after it was pushed (gradients are pushed as "
                                "backward() makes them with overlap=True): clip or "
                                "unscale them with gt.DistributedOptimizer(..., "
                                "overlap=False)"
                                % model.names[i])


def _name_element(model, message):
    """'element N ...' of the flat gradient as the parameter it belongs to."""
    import re
    m = re.search(r"element (\d+)", message)
    if not m:
        return message
    at = int(m.group(1))
    for name, p, off in zip(model.names, model.params, model.offsets):
        if off <= at < off + p.numel():
            return "parameter '%s' (element %d): %s" % (name, at - off, message)
    return message


def report(loss=None):
    """Adds the training loss to the progress grpsctl and grps-local show."""
    if loss is not None:
        _require_worker().report_loss(float(loss))


def done(test_accuracy=None, test_loss=None, evaluate=None):
    """This worker is done: reports its evaluation, then waits until the job
    ends. ``evaluate``: a function returning (accuracy, loss), run on the
    final weights (in the model) when the coordinator asks this worker for
    the job's final evaluation; without it, the figures given are the
    final ones."""
    p = _require_process()
    w = _require_worker()
    w.done(None if test_accuracy is None else float(test_accuracy),
           None if test_loss is None else float(test_loss))
    evaluated = False
    while w.await_end():
        if evaluated:
            continue
        try:
            if evaluate is not None:
                w.pull_final(p.model.flat.numpy())
                p.model.weights_to_params()
                acc, loss = evaluate()
                test_accuracy, test_loss = acc, loss
            if test_accuracy is None:
                raise ValueError("the coordinator asks this worker for the final evaluation: "
                                 "pass test_accuracy (or evaluate=) to gt.done()")
            w.done(float(test_accuracy), None if test_loss is None else float(test_loss))
        except JobEnded:
            # The job completed while this worker was asked (the figures a
            # done() carried, this one's or another rank's, were final).
            return
        evaluated = True


def state_dict(checkpoint=None):
    """The job's dense weights by parameter name: as this worker last pulled
    them, or, with ``checkpoint`` (a ckpt-<id> folder, or a checkpoint_dir
    whose newest complete checkpoint is read), as that checkpoint holds
    them (no job or gt.init() needed)."""
    if checkpoint is not None:
        return {name: torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)
                for name, shape, data in _grps.read_checkpoint(str(checkpoint))}
    p = _require_process()
    _require_worker()
    m = p.model
    return {name: m.flat[at:at + t.numel()].view(t.shape).clone()
            for name, t, at in zip(m.names, m.params, m.offsets)}


class _SparseTable(torch.nn.Module):
    """Rows of a grps sparse table: the rows a batch reads are pulled, their
    gradients pushed at the optimizer's step."""

    def __init__(self, table, dim):
        super().__init__()
        self.table = table
        self.dim = int(dim)
        self._pending = []  # (unique ids, rows tensor with grad) of this step
        p = _require_process()
        p.tables.append(self)

    def _rows(self, ids):
        """The rows of `ids` (any shape, int64) as a leaf tensor that trains,
        and the inverse map from ids to them."""
        w = _require_worker()
        _begin(_require_process())
        flat_ids = ids.reshape(-1).to(torch.int64).cpu()
        unique, inverse = torch.unique(flat_ids, return_inverse=True)
        unique = unique.contiguous()
        rows = torch.empty((unique.numel(), self.dim), dtype=torch.float32)
        if unique.numel() > 0:
            w.pull_rows(self.table, unique.numpy(), rows.numpy())
        rows.requires_grad_(True)
        self._pending.append((unique, rows))
        return rows, inverse

    def _push(self, w):
        pending, self._pending = self._pending, []
        read = [(unique, rows.grad) for unique, rows in pending if rows.grad is not None]
        if read:
            # A row read by several forward calls of the step: one summed gradient.
            ids, inverse = torch.unique(torch.cat([u for u, _ in read]), return_inverse=True)
            grads = torch.zeros((ids.numel(), self.dim), dtype=torch.float32)
            grads.index_add_(0, inverse, torch.cat([g for _, g in read]).to(torch.float32))
        else:
            ids = torch.empty(0, dtype=torch.int64)
            grads = torch.empty((0, self.dim), dtype=torch.float32)
        # Every step pushes (an empty push where no row was read): the
        # table's step completes with every worker's push in sync.
        w.push_rows(self.table, ids.contiguous().numpy(), grads.contiguous().numpy())


class Embedding(_SparseTable):
    """torch.nn.Embedding whose rows live in the job's sparse table `table`
    (grps-local --sparse_tables=NAME:ROWS:DIM): ids index rows."""

    def forward(self, ids):
        rows, inverse = self._rows(ids)
        return rows[inverse].reshape(*ids.shape, self.dim)


class EmbeddingBag(_SparseTable):
    """torch.nn.EmbeddingBag (2-d ids, one bag per row; or 1-d ids with
    offsets) over the job's sparse table `table`, mode "sum" or "mean"."""

    def __init__(self, table, dim, mode="mean"):
        super().__init__(table, dim)
        if mode not in ("sum", "mean"):
            raise ValueError("mode must be 'sum' or 'mean'")
        self.mode = mode

    def forward(self, ids, offsets=None):
        rows, inverse = self._rows(ids)
        if offsets is None:
            if ids.dim() != 2:
                raise ValueError("ids must be 2-d (one bag per row) unless offsets are given")
            gathered = rows[inverse].reshape(ids.shape[0], ids.shape[1], self.dim)
            return gathered.sum(1) if self.mode == "sum" else gathered.mean(1)
        bags = torch.zeros((offsets.numel(), self.dim), dtype=torch.float32)
        lengths = torch.diff(torch.cat([offsets.cpu(), torch.tensor([ids.numel()])]))
        bag_of = torch.repeat_interleave(torch.arange(offsets.numel()), lengths)
        bags = bags.index_add(0, bag_of, rows[inverse])
        if self.mode == "mean":
            bags = bags / lengths.clamp(min=1).unsqueeze(1).to(bags.dtype)
        return bags
