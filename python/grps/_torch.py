"""grps.torch's implementation: its API, with the names it exports, is
grps/torch.py."""

import atexit
import contextlib
import json
import os
import pickle
import signal
import struct
import sys
import threading
import time

import numpy as np
import torch

from grps import _grps
from grps._grps import Error, JobEnded

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
        # Broadcasts asked for before the worker joined (Horovod's order:
        # broadcast_parameters(state_dict), broadcast_optimizer_state, then
        # the DistributedOptimizer): run, in order, once it has.
        self.pending = []
        self.finished = False  # done() reported, or the rank left
        self.curve = _Curve(os.environ.get("GRPS_CURVE_CSV", ""))
        self.straggler = _straggler_from_environment()
        self.last_step_end = None  # time.monotonic() when the last step() returned
        self.samples = 0           # pushed by this worker's steps
        self.begun_at = 0          # the job's step when this worker began (> 0: it rejoined)


class _Curve:
    """The training curve grps-local asks for (GRPS_CURVE_CSV), written by
    grps-worker's own writer (_grps.CurveFile): its columns, a row per
    gt.report() and per done() with figures; no file until the first row."""

    def __init__(self, path):
        self.path = path
        self.file = None
        self.started = time.time()
        self.loss = self.accuracy = self.test_loss = self.auc = -1.0
        self.rate_from = (time.monotonic(), 0)  # (when, samples) of the rate's start
        self.rate = 0.0

    def row(self, step, samples, loss=None, accuracy=None, test_loss=None, auc=None):
        if not self.path:
            return
        if loss is not None:
            self.loss = float(loss)
        evaluated = accuracy is not None or test_loss is not None or auc is not None
        if auc is not None:
            self.auc = float(auc)
        if accuracy is not None:
            self.accuracy = float(accuracy)
        if test_loss is not None:
            self.test_loss = float(test_loss)
        now = time.monotonic()
        since, before = self.rate_from
        if now - since >= 1.0:
            self.rate = (samples - before) / (now - since)
            self.rate_from = (now, samples)
        if self.file is None:
            self.file = _grps.CurveFile(self.path, self.started)
        self.file.write(step, 0, self.loss, self.rate, self.accuracy, self.test_loss, evaluated,
                        self.auc)


def _straggler_from_environment():
    """grps-worker's straggler (_grps.Straggler) for the rank grps-local
    makes one (GRPS_STRAGGLE_FACTOR, GRPS_STRAGGLE_MS); None for the others."""
    factor = os.environ.get("GRPS_STRAGGLE_FACTOR", "")
    delay_ms = os.environ.get("GRPS_STRAGGLE_MS", "")
    if not factor and not delay_ms:
        return None
    factor, delay_s = float(factor or 1), float(delay_ms or 0) / 1000.0
    straggler = _grps.Straggler(factor, delay_s)
    print("grps.torch: a straggler: %gx its own step time + %g ms per step"
          % (factor, delay_s * 1000), file=sys.stderr, flush=True)
    return straggler


_process = None


def _env_int_first(names, default):
    """_env_int of the first of `names` the environment has."""
    for name in names:
        if name in os.environ:
            return _env_int(name, default)
    return default


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
    127.0.0.1:7070), GRPS_RANK or torchrun's RANK (-1: any free rank), GRPS_JOB_ID (the job
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
    if rank is None:
        rank = _env_int_first(("GRPS_RANK", "RANK"), -1)
    rank = int(rank)
    if register_timeout_s is None:
        register_timeout_s = float(os.environ.get("GRPS_REGISTER_TIMEOUT_S", "")
                                   or _grps.REGISTER_TIMEOUT_S)
    job_id = os.environ.get("GRPS_JOB_ID", "") if job_id is None else job_id
    _process = _Process(coordinator, rank, register_timeout_s, job_id)
    global _exit_registered
    if not _exit_registered:
        atexit.register(_done_at_exit)
        _exit_registered = True
    if (leave_on_sigterm and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        _grps.leave_on_sigterm()


_exit_registered = False


def _done_at_exit():
    """A program that ends without gt.done() (a Horovod script has none)
    is done when it ends normally: its rank finishes, as done() with no
    figures. One that ends by an exception it did not catch is not: its
    rank dies, as a crashed worker's does."""
    p = _process
    if p is None or p.worker is None or p.finished:
        return
    if hasattr(sys, "last_type"):
        # The parts backward() pushed early may still be pulling weights
        # into the model: they end before Python frees it.
        p.worker.abandon_step()
        return
    try:
        done()
    except (JobEnded, KeyboardInterrupt):
        pass


def is_initialized():
    """Whether gt.init() ran (and shutdown() did not since)."""
    return _process is not None


def shutdown():
    """This process is done with grps: a worker that joined and did not
    call gt.done() does now (without figures); then is_initialized() is
    False and gt.init() may start again (a new job)."""
    global _process
    p = _process
    if p is not None and p.worker is not None and not p.finished:
        done()
    _process = None


def _require_process():
    if _process is None:
        raise RuntimeError("call gt.init() first")
    return _process


def _leave(p):
    """SIGTERM or a drain: this step was the last; the rank leaves the job."""
    p.worker.leave()
    p.finished = True
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
    """This worker's rank: the rank the coordinator gave once the worker
    joined; before, the one it asks for (gt.init's rank, GRPS_RANK or
    torchrun's RANK, which grps-local and the Kubernetes overlay set)."""
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
    workers = _env_int("GRPS_WORKERS", 0) or _env_int("WORLD_SIZE", 0)
    if workers > 0:
        return workers
    return int(_job_status(p)["config"]["num_workers"])


def local_rank():
    """This worker's rank among the workers on its host: GRPS_LOCAL_RANK or
    torchrun's LOCAL_RANK (grps-local: the rank; a Kubernetes pod: 0); 0
    where no launcher says (one worker per host). For picking a GPU:
    ``torch.cuda.set_device(gt.local_rank())``."""
    _require_process()
    return _env_int_first(("GRPS_LOCAL_RANK", "LOCAL_RANK"), 0)


def local_size():
    """The workers on this worker's host: GRPS_LOCAL_SIZE or torchrun's
    LOCAL_WORLD_SIZE; 1 where no launcher says."""
    _require_process()
    return _env_int("GRPS_LOCAL_SIZE", 0) or _env_int("LOCAL_WORLD_SIZE", 0) or 1


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


class ElasticSampler(torch.utils.data.Sampler):
    """The examples of ``data_source`` this worker trains, for a DataLoader:
    ``DataLoader(data, batch_size=B, sampler=gt.ElasticSampler(data))``,
    where B is the job's --batch (one step's examples). Iterate it after the
    worker joined (gt.DistributedOptimizer or gt.broadcast_parameters).

    In an elastic job (--max_workers) the examples are leased from the
    coordinator's example ledger one block (one step's examples) at a time,
    so that every example of each epoch is trained once however many
    workers join and leave: a worker that leaves reports what it trained
    and the rest of its blocks go to the others; one that joins takes
    blocks from the next lease on. An iteration yields this worker's blocks
    of one epoch (in the job's shuffled order) and ends at the epoch's end
    or once the ledger (--epochs, or --steps x --workers blocks) has none
    left, after which iterations yield nothing: loop over epochs as usual
    and call gt.done() after. A block that came back from a worker that
    left is trained in the iteration at hand, whatever its epoch.
    ``epoch`` is the epoch of the last block yielded (with a DataLoader of
    no worker processes, the batch at hand's).

    In a fixed job it is a DistributedSampler of the job's size and this
    worker's rank (shuffled with the job's seed, a new order each
    iteration, the last partial share dropped), so one script runs either
    way. ``batch_size``, when given, must be the job's."""

    def __init__(self, data_source, batch_size=None):
        self.num_examples = len(data_source)
        self.batch_size = batch_size
        self.epoch = 0
        self._next_step = 0   # the step the next block is for (a DataLoader prepares ahead)
        self._seen_step = 0   # the worker's step at the last block
        self._iterations = 0  # a fixed job's: the next iteration's epoch

    def _worker(self):
        p = _require_process()
        if p.worker is None:
            raise RuntimeError("iterate gt.ElasticSampler once the worker joined its job "
                               "(gt.DistributedOptimizer or gt.broadcast_parameters first)")
        _begin(p)
        w = p.worker
        if self.batch_size is not None and int(self.batch_size) != w.step_examples:
            raise ValueError("ElasticSampler(batch_size=%d): the job's step is %d examples "
                             "(--batch); a block of the ledger is one step's"
                             % (self.batch_size, w.step_examples))
        return w

    def __iter__(self):
        w = self._worker()
        if not w.elastic:
            self.epoch = self._iterations
            self._iterations += 1
            seed = int(json.loads(w.config_json).get("seed", 0))
            fixed = torch.utils.data.distributed.DistributedSampler(
                range(self.num_examples), num_replicas=w.size, rank=w.rank, shuffle=True,
                seed=seed, drop_last=True)
            fixed.set_epoch(self.epoch)
            yield from fixed
            return
        top = None  # this iteration's epoch
        while True:
            if w.step_count < self._seen_step:
                # A roll-back: the coordinator took back the leases, and the
                # worker trains from the restore's step again.
                self._next_step = w.step_count
            self._seen_step = w.step_count
            step = max(self._next_step, w.step_count)
            leased = w.lease_block(self.num_examples, step)
            if leased is None:
                return  # the ledger has no block left
            examples, epoch = leased
            if top is None:
                top = epoch
            elif epoch > top:
                return  # a later epoch's: the next iteration starts with it
            # (A block of an earlier epoch came back from a worker that left.)
            self.epoch = epoch
            self._next_step = step + 1
            yield from examples.tolist()

    def __len__(self):
        """This worker's examples per epoch if the job's size stays (an
        estimate in an elastic job)."""
        p = _require_process()
        workers = p.worker.size if p.worker is not None else size()
        block = p.worker.step_examples if p.worker is not None else (self.batch_size or 1)
        return (self.num_examples // block) // max(1, workers) * block


def _job_status(p):
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


def _checked_trainable(named_parameters):
    """_trainable's names and parameters, each one grps can train."""
    names, params = _trainable(named_parameters)
    if not params:
        raise ValueError("the model has no parameter that trains (requires_grad)")
    for name, p in zip(names, params):
        _check_parameter(name, p, (names[0], params[0]))
    return names, params


class _Model:
    """The trainable parameters as one flat float32 array (the job's dense
    layout), and how each parameter maps into it."""

    def __init__(self, named_parameters):
        self.names, self.params = _checked_trainable(named_parameters)
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

    def params_to_flat(self):
        """The parameters that are not views into the flat values (after an
        optimizer that runs here changed them)."""
        with torch.no_grad():
            for p, at in zip(self.params, self.offsets):
                view = self.flat[at:at + p.numel()]
                if p.data_ptr() == view.data_ptr():
                    continue
                view.copy_(p.detach().reshape(-1))
                if p.dtype == torch.float32 and p.device.type == "cpu":
                    p.data = view.view(p.shape)  # an optimizer that set p.data anew

    def grads_to_params(self, grads):
        """Each parameter's `grad` from the flat array `grads` (a copy)."""
        with torch.no_grad():
            for p, at in zip(self.params, self.offsets):
                p.grad = grads[at:at + p.numel()].view(p.shape).to(p.device, p.dtype, copy=True)

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


def _join(named_parameters, optimizer_kind=""):
    """Joins the job with the model `named_parameters` (the first worker's
    offer defines the job's model and, with `optimizer_kind`, the kind of
    optimizer its servers keep state for)."""
    p = _require_process()
    if p.worker is not None:
        if not p.model.same(named_parameters):
            raise ValueError("this process joined its job with other parameters; one model per "
                             "process")
        return p
    model = _Model(named_parameters)
    p.worker = _grps.Worker(p.coordinator, model.spec(), p.requested_rank,
                            p.register_timeout_s, p.job_id, optimizer_kind)
    p.model = model
    # The job's tables are known now: a module of another dim is refused
    # before its first forward.
    for table in p.tables:
        table._check_dim(p.worker.tables)
    if p.declared_steps is not None:
        p.worker.set_total_steps(p.declared_steps)
    if p.pending:
        # broadcast_parameters was asked for before the model was known: the
        # job's weights are in the model before its first forward pass.
        _begin(p)
    return p


def broadcast_parameters(params, root_rank=0):
    """The job's weights into the model: on a fresh job rank 0's own values
    become the job's initial weights (every other rank waits for them); on a
    job that runs (a restarted worker, a job resumed from a checkpoint) the
    job's current weights. Joins the job if the optimizer has not yet.

    ``params``: the model, its ``named_parameters()``, or (Horovod's form)
    its ``state_dict()``. With a state dict, the tensors that are not the
    job's (buffers such as batch norm statistics, frozen parameters) take
    rank 0's values on a fresh job (a restarted rank keeps its own); asked
    before the model is known (Horovod's order: before the
    DistributedOptimizer), it is done once it is."""
    if root_rank != 0:
        raise ValueError("grps takes the initial weights from rank 0")
    if isinstance(params, dict):
        tensors = {k: v for k, v in params.items() if isinstance(v, torch.Tensor)}
        _when_joined(lambda p: _broadcast_others(p, tensors))
        return
    named = params.named_parameters() if isinstance(params, torch.nn.Module) else params
    p = _join(named)
    _begin(p)


def _when_joined(action):
    """`action(process)` now if the worker joined, else once it does."""
    p = _require_process()
    if p.worker is None:
        p.pending.append(action)
    else:
        _begin(p)
        action(p)


def _broadcast_others(p, tensors):
    """Rank 0's values of `tensors` (name -> tensor) that are not the job's
    weights into this process's, on a fresh job."""
    model = p.model
    ptrs = {t.data_ptr() for t in model.params}
    others = {k: v for k, v in tensors.items()
              if k not in model.names and v.data_ptr() not in ptrs}
    if not others or p.worker.step_count > 0:
        return
    _broadcast_into(others, "grps.broadcast_parameters")


def _broadcast_into(tensors, name):
    """Rank 0's `tensors` (name -> tensor) into this process's, in place."""
    root = _broadcast_from(lambda: {k: _to_numpy(v) for k, v in tensors.items()}, 0, name)
    with torch.no_grad():
        for k, v in tensors.items():
            if k not in root:
                raise Error("broadcast '%s': rank 0 has no tensor '%s'" % (name, k))
            v.copy_(_from_numpy(root[k]).to(v.device, v.dtype).reshape(v.shape))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Horovod's broadcast of the optimizer's state from `root_rank`, on a
    fresh job (a resume that rank 0 loaded), once the worker joined (as
    broadcast_parameters). An optimizer the servers run keeps its state
    (momentum, moments) there, one for the job (rank 0's load_state_dict()
    put it there): its param groups' hyperparameters take root_rank's. One
    that runs on the workers (RMSprop, a custom one): its whole
    state_dict(). grps's form of DistributedOptimizer has no
    hyperparameters: nothing."""
    if isinstance(optimizer, _JobOptimizer) and optimizer._grps_class is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("broadcast_optimizer_state takes a torch.optim.Optimizer")

    def action(p):
        if p.worker.step_count > 0:
            return
        if _on_workers(optimizer):
            # Its state is this process's own: root_rank's, whole, as Horovod's.
            state = _broadcast_from(optimizer.state_dict, root_rank,
                                    "grps.broadcast_optimizer_state")
            if rank() != root_rank:
                optimizer.load_state_dict(state)
            return
        groups = _broadcast_from(lambda: [_hyperparameters(g) for g in optimizer.param_groups],
                                 root_rank, "grps.broadcast_optimizer_state")
        if len(groups) != len(optimizer.param_groups):
            raise Error("broadcast_optimizer_state: rank %d's optimizer has %d param groups, "
                        "this one %d" % (root_rank, len(groups), len(optimizer.param_groups)))
        for mine, theirs in zip(optimizer.param_groups, groups):
            mine.update(theirs)
    _when_joined(action)


def _on_workers(optimizer):
    """Whether `optimizer` (wrapped or not) runs on the workers."""
    if isinstance(optimizer, _JobOptimizer):
        return optimizer._on_workers
    return _program_kind(type(optimizer), optimizer.param_groups) == "workers"


def _when_begun(p, action):
    """`action(process)` once the worker has begun (given its initial
    values and pulled its first weights): now if it has, else at its
    begin (before the first step's push)."""
    if p.begun:
        action(p)
    else:
        p.pending.append(action)


def _begin(p):
    if p.begun:
        return
    w = p.worker
    w.begin(p.model.flat.numpy(), w.rank == 0)
    p.model.weights_to_params()
    p.begun = True
    p.begun_at = w.step_count
    pending, p.pending = p.pending, []
    for action in pending:
        action(p)


# ---- Collectives: metrics and small tensors, through the job's coordinator ----

class _Constant:
    """A named constant of the API (gt.Average, gt.Compression.fp16, ...)."""

    def __init__(self, qualified):
        self.qualified = qualified

    def __repr__(self):
        return self.qualified


Average = _Constant("grps.torch.Average")
Sum = _Constant("grps.torch.Sum")
Min = _Constant("grps.torch.Min")
Max = _Constant("grps.torch.Max")
Product = _Constant("grps.torch.Product")
Adasum = _Constant("grps.torch.Adasum")


class Compression:
    """The dtype gradients and weights cross the network in: ``none`` (the
    job's --wire_dtype) or ``fp16`` (the job's --wire_dtype=f16; asked of a
    job without it, DistributedOptimizer raises)."""
    none = _Constant("grps.torch.Compression.none")
    fp16 = _Constant("grps.torch.Compression.fp16")


_COLLECTIVE_TIMEOUT_S = 600.0
# The most one rank gives one collective round (the coordinator's
# Collectives::kMaxPayloadBytes); a broadcast of more takes several rounds.
_COLLECTIVE_PAYLOAD = 4 << 20


def _collective(name, payload):
    p = _require_process()
    if p.worker is None:
        raise RuntimeError("collectives need the worker in its job: create the "
                           "gt.DistributedOptimizer (or call gt.broadcast_parameters) first")
    timeout = float(os.environ.get("GRPS_COLLECTIVE_TIMEOUT_S", "") or _COLLECTIVE_TIMEOUT_S)
    return p.worker.collective(str(name), bytes(payload), timeout)


def _broadcast_from(value, root_rank, name):
    """`root_rank`'s value() (picklable; called there only) on every live
    worker, through the collective `name`."""
    root = rank() == root_rank
    payload = pickle.dumps(value()) if root else b""
    # Rounds of at most _COLLECTIVE_PAYLOAD; the first says how many.
    size = _COLLECTIVE_PAYLOAD - 8
    parts = [payload[i:i + size] for i in range(0, len(payload), size)] or [b""]
    got, count = [], 1
    while len(got) < count:
        mine = parts[len(got)] if root else b""
        if root and not got:
            mine = struct.pack("<Q", len(parts)) + mine
        sent = dict(_collective(name, mine)).get(root_rank)
        if sent is None:
            raise Error("broadcast '%s': rank %d did not take part (it is not alive)"
                        % (name, root_rank))
        if not got:
            count, sent = struct.unpack("<Q", sent[:8])[0], sent[8:]
        got.append(sent)
    return pickle.loads(b"".join(got))


def _to_numpy(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return ("bfloat16", t.float().numpy())
    return (None, t.numpy())


def _from_numpy(packed):
    kind, array = packed
    t = torch.from_numpy(np.array(array))
    return t.to(torch.bfloat16) if kind == "bfloat16" else t


def _reduce(tensors, op):
    """`tensors` (one per rank, in rank order) reduced by `op`, in that
    order: the same bits on every worker."""
    out = tensors[0].clone()
    for t in tensors[1:]:
        if op is Min:
            out = torch.minimum(out, t)
        elif op is Max:
            out = torch.maximum(out, t)
        elif op is Product:
            out = out * t
        else:
            out = out + t
    if op is Average:
        if out.is_floating_point() or out.is_complex():
            out = out / len(tensors)
        else:
            out = torch.div(out, len(tensors), rounding_mode="floor")
    return out


def _op_of(average, op):
    if op is None:
        op = Average if average is None or average else Sum
    if op is Adasum:
        raise NotImplementedError("Adasum is not in grps: use op=gt.Average or gt.Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError("op must be gt.Average, gt.Sum, gt.Min, gt.Max or gt.Product")
    return op


def _check_bool_reduction(tensors, op, prescale_factor, postscale_factor):
    """Raises TypeError, before any worker waits on the collective, for a
    reduction of bool tensors that has no bool meaning."""
    if not any(t.dtype == torch.bool for t in tensors):
        return
    # As torch.distributed's all_reduce refuses ReduceOp.AVG of bools: a
    # mean of truth values is not a truth value.
    if op is Average:
        raise TypeError("allreduce: op=gt.Average of a bool tensor (a mean of truth values is "
                        "not one): use op=gt.Sum or gt.Max (any rank's True) or gt.Min or "
                        "gt.Product (every rank's True), or allreduce a float tensor")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise TypeError("allreduce: prescale_factor and postscale_factor scale numbers, not "
                        "the truth values of a bool tensor")


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Each tensor of `tensors` reduced over the job's live workers (op:
    Average, the default, Sum, Min, Max or Product), as new tensors on the
    tensors' devices. Bool tensors reduce as torch.distributed reduces them:
    Sum and Max are a logical or, Min and Product a logical and; Average,
    and a prescale or postscale factor, of a bool tensor raise TypeError
    (pass op=gt.Sum, or a float tensor for a fraction of the ranks).
    For metrics and small tensors (at most 4 MiB a call):
    they travel through the job's coordinator; the model's gradients go to
    the servers through the optimizer. Every live worker must make the same
    calls in the same order (calls pair up by name and order); a worker that
    died is not waited for, and an average is over the workers that took
    part. A call waits for the others at most GRPS_COLLECTIVE_TIMEOUT_S
    (600 s), then raises grps.Error (DEADLINE_EXCEEDED). ``compression`` is
    accepted and changes nothing: the values travel as they are."""
    if process_set is not None:
        raise NotImplementedError("process sets are not in grps: every collective is the "
                                  "job's live workers")
    op = _op_of(average, op)
    tensors = list(tensors)
    _check_bool_reduction(tensors, op, prescale_factor, postscale_factor)
    scaled = [t.detach() * prescale_factor if prescale_factor != 1.0 else t.detach()
              for t in tensors]
    name = "grps.allreduce." + (name or "noname")
    results = _collective(name, pickle.dumps([_to_numpy(t) for t in scaled]))
    per_rank = [pickle.loads(payload) for _, payload in results]
    out = []
    for i, t in enumerate(tensors):
        reduced = _reduce([_from_numpy(r[i]) for r in per_rank], op)
        if postscale_factor != 1.0:
            reduced = reduced * postscale_factor
        out.append(reduced.to(t.device, t.dtype).reshape(t.shape))
    return out


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """`tensor` reduced over the job's live workers, as a new tensor (see
    grouped_allreduce): ``gt.allreduce(torch.tensor(acc), name="acc")`` is
    the workers' mean accuracy."""
    return grouped_allreduce([tensor], average, name, compression, op, prescale_factor,
                             postscale_factor, process_set)[0]


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None):
    """allreduce into `tensor` itself; returns it."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name, None, op, prescale_factor,
                               postscale_factor, process_set))
    return tensor


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None):
    """grouped_allreduce into the tensors themselves; returns them."""
    tensors = list(tensors)
    with torch.no_grad():
        for t, r in zip(tensors, grouped_allreduce(tensors, average, name, None, op,
                                                   prescale_factor, postscale_factor,
                                                   process_set)):
            t.copy_(r)
    return tensors


def allgather(tensor, name=None, process_set=None):
    """Every live worker's `tensor`, concatenated along the first dimension
    in rank order (the first dimensions may differ)."""
    if process_set is not None:
        raise NotImplementedError("process sets are not in grps")
    results = _collective("grps.allgather." + (name or "noname"),
                          pickle.dumps(_to_numpy(tensor.reshape(tensor.shape or (1,)))))
    parts = [_from_numpy(pickle.loads(payload)) for _, payload in results]
    return torch.cat(parts).to(tensor.device, tensor.dtype)


def allgather_object(obj, name=None):
    """Every live worker's `obj` (picklable), as a list in rank order."""
    results = _collective("grps.allgather_object." + (name or "noname"), pickle.dumps(obj))
    return [pickle.loads(payload) for _, payload in results]


def broadcast(tensor, root_rank, name=None, process_set=None):
    """`root_rank`'s `tensor`, as a new tensor on every live worker."""
    if process_set is not None:
        raise NotImplementedError("process sets are not in grps")
    value = _broadcast_from(lambda: _to_numpy(tensor), root_rank,
                            "grps.broadcast." + (name or "noname"))
    return _from_numpy(value).to(tensor.device, tensor.dtype).reshape(tensor.shape)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """broadcast into `tensor` itself; returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name, process_set))
    return tensor


def broadcast_object(obj, root_rank=0, name=None):
    """`root_rank`'s `obj` (picklable) on every live worker. Objects come
    from the job's other workers (authenticated by the worker token) and
    are unpickled, as Horovod's are."""
    return _broadcast_from(lambda: obj, root_rank, "grps.broadcast_object." + (name or "noname"))


def barrier():
    """Returns once every live worker has called barrier()."""
    _collective("grps.barrier", b"")


def join(device=-1):
    """Horovod's join: waits until every live worker has joined; returns
    the highest rank that took part. (A grps sync step never waits for a
    worker that finished, so uneven data needs no more than this.)"""
    results = _collective("grps.join", b"")
    return max(r for r, _ in results)


# ---- The optimizer ----

# torch optimizers the servers run: the job's OptimizerKind, and the
# hyperparameters that must equal the job's (group key -> config field).
# The torch optimizers grps's servers run: their kind (the job's --optimizer)
# and which of a param group's keys go to which OptimizerConfig field.
_SERVER_OPTIMIZERS = {
    torch.optim.SGD: ("sgd", {"lr": "lr", "momentum": "momentum",
                              "weight_decay": "weight_decay"}),
    torch.optim.Adam: ("adam", {"lr": "lr", "weight_decay": "weight_decay", "eps": "epsilon"}),
    torch.optim.AdamW: ("adam", {"lr": "lr", "weight_decay": "weight_decay", "eps": "epsilon"}),
    torch.optim.Adagrad: ("adagrad", {"lr": "lr", "weight_decay": "weight_decay",
                                      "eps": "epsilon"}),
}
_KIND_FLAG = {"OPTIMIZER_SGD": "sgd", "OPTIMIZER_MOMENTUM": "momentum",
              "OPTIMIZER_NESTEROV": "nesterov", "OPTIMIZER_ADAM": "adam",
              "OPTIMIZER_ADAGRAD": "adagrad", "OPTIMIZER_WORKERS": "workers"}
# Optimizers that cannot run on grps at all: step() re-evaluates the model
# (LBFGS's closure) or takes sparse gradients.
_REFUSED_OPTIMIZERS = {
    torch.optim.LBFGS: "LBFGS evaluates the model again inside step(closure), which a "
                       "distributed step cannot do",
    torch.optim.SparseAdam: "SparseAdam takes sparse gradients; grps pushes dense ones (use "
                            "gt.EmbeddingBag for sparse rows)",
}


def _f32(x):
    return float(np.float32(x))


def _server_form(cls, g, job_kind):
    """Param group `g` of an optimizer of class `cls` as the servers run it
    in a job whose --optimizer is `job_kind`: a dict for
    Worker.set_optimizers. Raises NotImplementedError for what grps's
    servers do not run, ValueError for a kind whose state the job's servers
    do not keep (naming the --optimizer that does)."""
    if cls not in _SERVER_OPTIMIZERS:
        raise NotImplementedError(
            "grps's servers run SGD (momentum, nesterov, weight decay), Adam, AdamW and "
            "Adagrad; this program's optimizer is %s" % cls.__name__)
    kind, fields = _SERVER_OPTIMIZERS[cls]
    if g.get("maximize"):
        raise NotImplementedError("%s(maximize=True) is not run by grps's servers" % cls.__name__)
    if cls is torch.optim.SGD:
        if g.get("dampening", 0):
            raise NotImplementedError("SGD with dampening is not run by grps's servers")
        if g.get("momentum", 0) or job_kind in ("momentum", "nesterov"):
            # Momentum 0 in a momentum job: the velocity is the gradient.
            kind = "nesterov" if g.get("nesterov") else "momentum"
    if cls in (torch.optim.Adam, torch.optim.AdamW) and g.get("amsgrad"):
        raise NotImplementedError("%s(amsgrad=True) is not run by grps's servers" % cls.__name__)
    if cls is torch.optim.Adagrad and (g.get("lr_decay", 0) or
                                       g.get("initial_accumulator_value", 0)):
        raise NotImplementedError("Adagrad with lr_decay or initial_accumulator_value is not "
                                  "run by grps's servers")
    same_state = kind == job_kind or {kind, job_kind} <= {"momentum", "nesterov"}
    if not same_state:
        raise ValueError(
            "this program's %s runs on grps's servers as --optimizer=%s, but the job's is "
            "--optimizer=%s (its first worker's optimizer, or its flags), whose state "
            "(velocity, moments) the servers keep: every worker must run the same kind of "
            "optimizer, or pass model.named_parameters() to train with the job's"
            % (cls.__name__, kind, job_kind))
    form = {field: _f32(g[key]) for key, field in fields.items() if key in g}
    form["kind"] = kind
    if cls in (torch.optim.Adam, torch.optim.AdamW):
        form["beta1"], form["beta2"] = _f32(g["betas"][0]), _f32(g["betas"][1])
    if cls is torch.optim.AdamW:
        form["decoupled_weight_decay"] = True
    return form


def _job_kind(config):
    return _KIND_FLAG.get(config.get("optimizer", {}).get("kind"), "sgd")


def _hyperparameters(group):
    return {k: v for k, v in group.items() if k != "params"}


class _JobOptimizer:
    """What gt.DistributedOptimizer adds to an optimizer class: step()
    pushes the gradients to the servers, which run the optimizer, and
    leaves in the parameters the weights the mode serves next."""

    def _grps_setup(self, named, backward_passes_per_step, overlap, optimizer_kind=""):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        # The program's optimizer runs here, not on the servers (kind "workers").
        self._on_workers = optimizer_kind == "workers"
        self._weights = None  # _step_on_workers's copy of the weights, reused every step
        self._process = _join(named, optimizer_kind)
        self._model = self._process.model
        self.backward_passes_per_step = int(backward_passes_per_step)
        # Read by the hooks at every call: may be changed between steps.
        # "auto": off for the first step, which watches whether the program
        # changes its gradients between backward() and step() (_decide).
        self._probing = overlap == "auto"
        self.overlap = False if self._probing else bool(overlap)
        self._marks = {}        # the probe step: parameter -> its p.grad when the hook ran
        self._passes = [0] * len(self._model.params)  # hook calls this step, by parameter
        self._early = set()     # parameters pushed by their hook this step
        self._refused = None    # the first early gradient that was not finite
        self._hooks = []
        self._synchronized = False
        self._grps_class = None  # the program's optimizer's class: its groups go to the servers
        self._sent = None        # the param groups' server forms as last set on the worker
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
        if self._passes[i] != self.backward_passes_per_step or self._on_workers:
            return
        if self._probing:
            self._watch(i)
            return
        if not self.overlap or self._refused is not None:
            return
        p = self._process
        if not p.begun:
            # The job's first weights are pulled at step() (no
            # broadcast_parameters before): not into a model in backward.
            return
        if not self._early:
            try:  # the step's first push: with the hyperparameters as they are now
                self._send_optimizers()
            except (ValueError, NotImplementedError) as e:
                self._refused = str(e)
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

    def _watch(self, i):
        """The probe step's hook: parameter i's gradient as backward() left
        it, copied where a push would read it, and which tensor held it at
        which version (an in-place change, as clipping's or unscaling's,
        counts one up even where it leaves the values)."""
        model = self._model
        try:
            model.grad_from_param(i, self.backward_passes_per_step)
        except ValueError:
            return  # a sparse gradient: step() says so
        self._marks[i] = _grad_mark(model.params[i])

    def _decide(self, marks, synchronized):
        """overlap="auto", at the first step(): on from the next step when no
        gradient backward() left changed before step(), and when the program
        did not call synchronize() (Horovod's sign that it changes them);
        off for the rest of the run otherwise."""
        self._probing = False
        if synchronized or not marks:
            return
        model = self._model
        with torch.no_grad():
            for i, mark in marks.items():
                if _grad_mark(model.params[i]) != mark or not self._same_grad(i):
                    return
        self.overlap = True

    def _same_grad(self, i):
        """Whether parameter i's p.grad (over the passes) still equals what
        was copied for its push."""
        param, passes = self._model.params[i], self.backward_passes_per_step
        now = (torch.zeros(param.numel()) if param.grad is None
               else param.grad.detach().reshape(-1).to("cpu", torch.float32))
        if passes > 1:
            now = now / passes
        return torch.equal(now, self._model.grad_view(i))

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

    def synchronize(self):
        """Horovod's: the gradients are final, the program may change them
        before step() (clipping, GradScaler.unscale_). grps pushes them at
        step(), as the program leaves them, so this only checks that no
        hook pushed one already (overlap on): grps.Error if one did."""
        if self._early:
            self._abandon()
            raise Error("synchronize(): with overlap on, backward() pushed %d gradients "
                        "already; to change gradients before step(), use "
                        "gt.DistributedOptimizer(..., overlap=False)" % len(self._early))
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: step() inside does not synchronize again (grps's step()
        pushes once in any case)."""
        yield

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
        _begin(p)  # first: broadcasts waiting for it may set hyperparameters
        model = self._model
        early, refused = self._early, self._refused
        if self._probing:
            self._decide(self._marks, self._synchronized)
            self._marks = {}
        passes, self._passes = self._passes, [0] * len(model.params)
        self._early, self._refused, self._synchronized = set(), None, False
        if refused is not None:
            self._abandon()
            raise ValueError(refused)
        self._check_unchanged(early, passes)
        model.grads_from_params(self.backward_passes_per_step, skip=early)
        # Checked before anything more is pushed, the rows of the sparse tables too.
        at = p.worker.first_non_finite(model.grads.numpy())
        if at >= 0:
            self._abandon()
            raise ValueError(_name_element(model, "element %d of step %d's gradient is %s: %s"
                                           % (at, p.worker.step_count, float(model.grads[at]),
                                              "it was not pushed, the gradients final before "
                                              "it were" if early else "nothing was pushed")))
        if self._on_workers:
            outcome = self._step_on_workers(samples)
        else:
            try:
                self._send_optimizers()
            except (ValueError, NotImplementedError):
                self._abandon()
                raise
            for table in p.tables:
                table._push(p.worker)
            outcome = self._exchange(samples)
            model.weights_to_params()
        if loss is not None:
            p.worker.report_loss(float(loss))
        p.samples += int(samples)
        if p.straggler is not None:
            now = time.monotonic()
            if p.last_step_end is not None:
                # In slices: a worker asked to leave (SIGTERM) stops sleeping.
                until = now + p.straggler.after_step(now - p.last_step_end)
                while time.monotonic() < until and not p.worker.leave_requested():
                    time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        p.last_step_end = time.monotonic()
        self.last_outcome = outcome
        self.last_early = len(early)  # parameters whose hooks pushed them
        if p.worker.leave_requested():
            _leave(p)
        return loss

    def _exchange(self, samples):
        """Pushes the flat gradients (model.grads) and pulls into the flat
        values what the mode serves next."""
        model = self._model
        try:
            return self._process.worker.step(model.grads.numpy(), model.flat.numpy(),
                                             int(samples))
        except ValueError as e:
            raise ValueError(_name_element(model, str(e))) from None

    def _step_on_workers(self, samples):
        """step() of an optimizer that runs here (kind "workers"). Sync: the
        servers average the step's gradients and every worker applies the
        average with the program's optimizer (the same bits on every
        worker). Async and ssp: this worker applies its own gradient and
        pushes the change of the weights, which the servers add; the next
        weights are the servers' newest."""
        p, model = self._process, self._model
        sync = self._mode == "MODE_SYNC"
        if sync and p.begun_at > 0:
            raise Error("this worker joined a running sync job whose optimizer runs on the "
                        "workers: the weights and the optimizer's state are the workers' own "
                        "and nobody gives them to a restarted worker; resume the job from "
                        "the program's own torch.save instead (docs/pytorch.md)")
        model.params_to_flat()
        if self._weights is None:
            self._weights = torch.empty_like(model.flat)
        weights = self._weights
        weights.copy_(model.flat)
        if sync:
            outcome = self._exchange(samples)
            if outcome["rolled_back"]:
                raise Error("the job rolled back (a server was restored from a checkpoint); "
                            "a sync job whose optimizer runs on the workers cannot: the "
                            "servers hold no weights of it. Resume from the program's own "
                            "torch.save (docs/pytorch.md)")
            model.grads.copy_(model.flat)  # the step's average gradient
            model.flat.copy_(weights)
        model.grads_to_params(model.grads)
        super().step()
        model.params_to_flat()
        if sync:
            return outcome
        torch.sub(model.flat, weights, out=model.grads)  # the change the servers add
        at = p.worker.first_non_finite(model.grads.numpy())
        if at >= 0:
            model.flat.copy_(weights)
            model.weights_to_params()
            raise ValueError(_name_element(model, "element %d of step %d's change of the "
                                           "weights is %s: the optimizer made it, nothing was "
                                           "pushed" % (at, p.worker.step_count,
                                                       float(model.grads[at]))))
        outcome = self._exchange(samples)
        model.weights_to_params()
        return outcome

    def _send_optimizers(self):
        """The program's optimizer as its param groups are now (an LR
        scheduler's lr, momentum, betas) to the worker, for the step's
        pushes, when they changed: the servers run each group's update with
        its own hyperparameters."""
        if self._grps_class is None or self._on_workers:
            return
        forms = [_server_form(self._grps_class, g, self._job_kind) for g in self.param_groups]
        if forms == self._sent:
            return
        group_of = {}
        for i, g in enumerate(self.param_groups):
            for q in g["params"]:
                group_of[id(q)] = i + 1
        by_tensor = [group_of.get(id(q), 0) for q in self._model.params]
        try:
            self._process.worker.set_optimizers(forms, by_tensor)
        except ValueError as e:
            raise ValueError("the program's optimizer: %s" % e) from None
        self._sent = forms

    def state_dict(self):
        """The optimizer's state_dict(), as torch's, its state (SGD's
        momentum buffers, Adam's moments and step, Adagrad's sums) read from
        the servers, which keep it: as of this worker's last step (in sync,
        every worker's). torch.save it with the model's state_dict(), and a
        new job resumes from both (load_state_dict) where this one is."""
        if self._grps_class is not None and not self._on_workers and self._process.begun:
            self._state_from_servers()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        """torch's load_state_dict (the param groups' hyperparameters reach
        the servers with the next step), and the state into the servers
        before the job's first update: rank 0's, on a job that starts (a
        restarted worker of a running job leaves the job's state as it is).
        The servers refuse a state once they have updated (grps.Error)."""
        groups = self.param_groups
        super().load_state_dict(state_dict)
        # torch's makes new group dicts; the ones before are also the
        # unwrapped optimizer's, which an LR scheduler made before
        # wrapping changes: they take the loaded values and stay.
        for mine, loaded in zip(groups, self.param_groups):
            mine.update(loaded)
        self.param_groups = groups
        if self._grps_class is not None and not self._on_workers:
            _when_begun(self._process, self._state_to_servers)

    _STATE_SLOTS = {torch.optim.SGD: ("momentum_buffer",),
                    torch.optim.Adam: ("exp_avg", "exp_avg_sq"),
                    torch.optim.AdamW: ("exp_avg", "exp_avg_sq"),
                    torch.optim.Adagrad: ("sum",)}

    def _state_from_servers(self):
        """self.state as torch's optimizer would hold it, from the servers."""
        got = self._process.worker.optimizer_state()
        names = self._STATE_SLOTS[self._grps_class] if got["slots"] else ()
        slots = [torch.from_numpy(a) for a in got["slots"]]
        model = self._model
        index = {id(q): i for i, q in enumerate(model.params)}
        for g in self.param_groups:
            for q in g["params"]:
                i = index.get(id(q))
                if i is None:  # not the job's (frozen): no state, as in torch
                    continue
                at, n = model.offsets[i], q.numel()
                state = {name: slot[at:at + n].clone().view(q.shape).to(q.device, q.dtype)
                         for name, slot in zip(names, slots)}
                if self._grps_class is torch.optim.SGD:
                    if not g.get("momentum", 0):  # torch keeps no buffer for it
                        state = {"momentum_buffer": None}
                else:
                    state["step"] = torch.tensor(float(got["steps"][i]))
                self.state[q] = state

    def _state_to_servers(self, p):
        """self.state (loaded) into the servers: rank 0's, on a fresh job."""
        w = p.worker
        if w.rank != 0 or w.step_count > 0:
            return
        kind = self._job_kind
        names = self._STATE_SLOTS[self._grps_class]
        slots = [np.zeros(w.num_parameters, dtype=np.float32)
                 for _ in range(len(names) if kind != "sgd" else 0)]
        model = self._model
        steps = [0] * len(model.params)
        for i, q in enumerate(model.params):
            state = self.state.get(q, {})
            at, n = model.offsets[i], q.numel()
            for slot, name in zip(slots, names):
                v = state.get(name)
                if v is not None:
                    slot[at:at + n] = v.detach().reshape(-1).to("cpu", torch.float32).numpy()
            if "step" in state:
                steps[i] = int(state["step"])
        try:
            w.load_optimizer_state(kind, slots, steps)
        except ValueError as e:
            raise ValueError("load_state_dict: %s" % e) from None

    def _abandon(self):
        """A refused step: the pushes its hooks started end (what they pushed
        stands, and their tensors may hold the next weights already), the
        rest is not pushed, and the step stays where it is."""
        self._process.worker.abandon_step()
        self._model.weights_to_params()

    def _check_unchanged(self, early, passes):
        """A gradient pushed by its hook that the program changed before
        step() (clipping, unscaling, another backward(): `passes`, the hook
        calls by parameter) would train with the old one: refused."""
        model = self._model
        with torch.no_grad():
            for i in early:
                if passes[i] > self.backward_passes_per_step:
                    self._abandon()
                    raise Error("backward() made the gradient of parameter '%s' %d times "
                                "before step(), %d a step: the first was pushed as it was "
                                "made (overlap on). To discard a backward() (zero_grad(), "
                                "then backward() again), use "
                                "gt.DistributedOptimizer(..., overlap=False); to accumulate "
                                "passes, backward_passes_per_step"
                                % (model.names[i], passes[i], self.backward_passes_per_step))
                if not self._same_grad(i):
                    self._abandon()
                    raise Error("the gradient of parameter '%s' changed between backward() "
                                "and step(), after it was pushed (with overlap on, each "
                                "gradient is pushed as backward() makes it; overlap=\"auto\" "
                                "turns it on when the first step leaves them as "
                                "backward() made them): to clip or unscale in some steps, "
                                "use gt.DistributedOptimizer(..., overlap=False)"
                                % model.names[i])


class _NamedOptimizer(_JobOptimizer, torch.optim.Optimizer):
    """gt.DistributedOptimizer(model.named_parameters()): the job's
    optimizer, whatever it is, with no hyperparameters of the program's."""

    def __init__(self, named, backward_passes_per_step, overlap):
        named = list(named)
        self._grps_setup(named, backward_passes_per_step, overlap)
        torch.optim.Optimizer.__init__(self, self._model.params, {})
        if _job_kind(_job_config(self._process)) == "workers":
            raise ValueError("the job's optimizer runs on the workers (--optimizer=workers, or "
                             "its first worker's optimizer): pass the program's torch optimizer, "
                             "gt.DistributedOptimizer(opt, named_parameters=...)")


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         overlap="auto", **horovod_only):
    """The optimizer of a grps worker: step() pushes the parameters'
    gradients to the servers, which run the optimizer, and leaves in the
    parameters the weights the mode serves next (sync: after every worker's
    gradient of this step; async: the newest; ssp: within the staleness
    bound).

    Horovod's form, ``gt.DistributedOptimizer(opt, named_parameters=
    model.named_parameters())``, returns an optimizer of the program's
    optimizer's class (isinstance holds; param_groups and state_dict() are
    its own, so every torch.optim.lr_scheduler works; state_dict() reads
    the optimizer's state from the servers, load_state_dict() loads a saved
    one into them: torch.save and a resume work). The servers run it:
    SGD (momentum, nesterov, weight decay), Adam, AdamW and Adagrad, each
    param group with its own hyperparameters as they are at each step (what
    a scheduler changes reaches the servers with the step that uses it; in
    async and ssp the learning rate is divided by the number of workers, as
    the job's is). The first worker's optimizer sets the kind whose state
    the servers keep (sgd, momentum, adam for Adam and AdamW, adagrad) in
    place of the job's --optimizer, whose --lr and other hyperparameter
    flags are not used; a later worker whose optimizer needs another kind
    raises ValueError.

    An optimizer the servers do not run (RMSprop, Adamax, a custom class,
    SGD with dampening, Adam with amsgrad) runs on the workers, the job's
    --optimizer becomes "workers" and the log and grpsctl status say so. In
    sync the servers average the gradients and every worker's step()
    applies the average with the program's optimizer (the same bits on
    every worker: broadcast_optimizer_state gives a resumed rank 0's state
    to all); in async and ssp each worker applies its own gradient and
    pushes the change of the weights, which the servers add (BytePS's
    asynchronous mode), and pulls the newest weights. Its state_dict() is
    this worker's own. A sync job of it does not survive a roll-back or a
    restarted worker (grps.Error): the weights are the workers'. LBFGS
    (step() re-evaluates the model) and SparseAdam raise
    NotImplementedError.

    grps's form,
    ``gt.DistributedOptimizer(model.named_parameters())``, trains with the
    job's optimizer and schedule (its flags), whatever they are.

    ``compression``: Compression.none, or Compression.fp16 for a job whose
    --wire_dtype is f16. ``op``: gt.Average (the servers average the
    workers' gradients); anything else raises. ``gradient_predivide_factor``
    changes nothing: the servers average in float32 as they receive.

    ``num_groups``, ``groups`` and ``sparse_as_dense`` (Horovod's fusion
    settings) are accepted and change nothing; a process set raises.

    ``backward_passes_per_step``: backward passes whose gradients add up in
    ``p.grad`` before each step(); the step pushes their mean.

    ``overlap`` ("auto", True or False): with it on, each parameter's
    gradient is pushed as soon as autograd has accumulated it in the step's
    last backward pass (a hook per parameter), so the pushes overlap the
    rest of backward. "auto" pushes the first step at step() and watches
    its gradients: when the program changed none of them between backward()
    and step() (clipping, AMP's unscaling; or called synchronize()),
    overlap is on from the second step, otherwise off for the run. With it
    on, a gradient pushed early that the program changed after raises
    grps.Error at step(). The default is "auto"; False pushes every step at
    step(), as the program left it.
    """
    if overlap != "auto" and overlap not in (True, False):
        raise ValueError("overlap must be \"auto\", True or False, not %r" % (overlap,))
    unknown = set(horovod_only) - {"num_groups", "groups", "sparse_as_dense", "process_set"}
    if unknown:
        raise TypeError("DistributedOptimizer() got unexpected arguments: %s"
                        % ", ".join(sorted(unknown)))
    if horovod_only.get("process_set") is not None:
        raise NotImplementedError("process sets are not in grps")
    if op is Adasum:
        raise NotImplementedError("Adasum is not in grps: the servers average the gradients")
    if op is not Average:
        raise NotImplementedError("grps's servers average the workers' gradients (op=gt.Average); "
                                  "for op=gt.Sum, multiply the lr by gt.size()")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError("compression must be gt.Compression.none or gt.Compression.fp16")
    # Checked before this worker joins: a refused program holds no rank.
    p = _require_process()
    if compression is Compression.fp16:
        wire = _job_config(p).get("wire_dtype")
        if wire != "DTYPE_F16":
            raise ValueError("Compression.fp16: gradients and weights cross the network in the "
                             "job's wire dtype (%s); start the job with --wire_dtype=f16" % wire)
    if not isinstance(optimizer, torch.optim.Optimizer):
        if named_parameters is not None:
            raise TypeError("DistributedOptimizer(named_parameters, named_parameters=...): "
                            "the first argument is the optimizer or the named parameters")
        return _NamedOptimizer(optimizer, backward_passes_per_step, overlap)
    named = _named_of(optimizer, named_parameters)
    _checked_trainable(named)
    return _wrap(optimizer, named, backward_passes_per_step, overlap)


def _named_of(optimizer, named_parameters):
    """The optimizer's parameters with their names from `named_parameters`
    (in its order), or numbered in the optimizer's order without it."""
    in_groups = [q for g in optimizer.param_groups for q in g["params"]]
    if named_parameters is None:
        return [("param.%d" % i, q) for i, q in enumerate(in_groups)]
    named = list(named_parameters)
    listed = {id(q) for _, q in named}
    missing = [q for q in in_groups if id(q) not in listed]
    if missing:
        raise ValueError("named_parameters lacks %d of the optimizer's parameters"
                         % len(missing))
    ids = {id(q) for q in in_groups}
    return [(n, q) for n, q in named if id(q) in ids]


def _job_config(p):
    """The job's JobConfig as a dict: the worker's, or the coordinator's
    before the worker joined."""
    if p.worker is None:
        return _job_status(p)["config"]
    return json.loads(p.worker.config_json)


def _holds_state(optimizer):
    """Whether the optimizer's state has anything trained in it (Adagrad
    makes its zero sums and step 0 at construction: nothing)."""
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v) and bool(v.ne(0).any()):
                return True
            if not torch.is_tensor(v) and v:
                return True
    return False


def _program_kind(cls, groups):
    """The job optimizer kind whose state the servers keep for an optimizer
    of class `cls` with param groups `groups`, or "workers" for one the
    servers do not run (it runs on the workers); raises
    NotImplementedError for what cannot run on grps at all."""
    if cls in _REFUSED_OPTIMIZERS:
        raise NotImplementedError(_REFUSED_OPTIMIZERS[cls])
    if cls is torch.optim.SGD:
        kind = "momentum" if any(g.get("momentum", 0) for g in groups) else "sgd"
    else:
        kind = _SERVER_OPTIMIZERS.get(cls, ("sgd",))[0]
    try:
        for g in groups:
            _server_form(cls, g, kind)
    except NotImplementedError:
        return "workers"
    return kind


def _wrap(optimizer, named, backward_passes_per_step, overlap):
    """An optimizer of `optimizer`'s class (Horovod's way) over its param
    groups, that pushes the parameters `named` to the job. Checked before
    the worker joins (a refused program holds no rank), and after: a job
    whose model another program defined keeps that program's kind."""
    cls = type(optimizer)
    kind = _program_kind(cls, optimizer.param_groups)
    wrapped = type(cls.__name__, (_JobOptimizer, cls), {})
    opt = wrapped.__new__(wrapped)
    opt._grps_setup(named, backward_passes_per_step, overlap, kind)
    torch.optim.Optimizer.__init__(opt, optimizer.param_groups, optimizer.defaults)
    opt._grps_class = cls
    config = _job_config(opt._process)
    opt._job_kind = _job_kind(config)
    opt._mode = config.get("mode", "MODE_SYNC")
    if opt._on_workers and opt._job_kind != "workers":
        raise ValueError(
            "this program's %s runs on the workers (grps's servers do not run it), but the "
            "job's servers run --optimizer=%s (its first worker's optimizer, or its flags): "
            "every worker must run the same kind of optimizer" % (cls.__name__, opt._job_kind))
    if not opt._on_workers and opt._job_kind == "workers":
        raise ValueError(
            "the job's optimizer runs on the workers (its first worker's optimizer, or "
            "--optimizer=workers), but this program's %s runs on the servers: every worker "
            "must run the same kind of optimizer" % cls.__name__)
    if not opt._on_workers:
        for g in opt.param_groups:
            _server_form(cls, g, opt._job_kind)
    if _holds_state(optimizer):
        # Loaded before it was wrapped (load_state_dict): the servers take
        # it, or (on the workers) this optimizer keeps it.
        opt.state.update(optimizer.state)
        if not opt._on_workers:
            _when_begun(opt._process, opt._state_to_servers)
    if opt._on_workers and opt._process.worker.rank == 0 and not opt._process.begun:
        print("grps: the program's %s runs on the workers: %s" % (
            cls.__name__, "the servers average the gradients" if opt._mode == "MODE_SYNC"
            else "the servers add the weights' changes the workers push"),
            file=sys.stderr, flush=True)
    return opt


def _grad_mark(param):
    """Which tensor holds param's gradient, and at which version of its
    in-place changes (None for no gradient)."""
    g = param.grad
    return None if g is None else (g.data_ptr(), g._version)


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


def report(loss=None, test_accuracy=None, test_loss=None, test_auc=None):
    """Adds the training loss to the progress grpsctl and grps-local show,
    and a row to the worker's curve (grps-local's curve-worker-<rank>.csv,
    which scripts/grps-compare reads): an evaluation row when a test
    accuracy, loss or AUC (a two-class model's) is given."""
    w = _require_worker()
    if loss is not None:
        w.report_loss(float(loss))
    p = _process
    p.curve.row(w.step_count, p.samples, loss, test_accuracy, test_loss, _check_auc(test_auc))


def _check_auc(auc):
    """An AUC in [0, 1]; None for none (None, or a negative one: the -1 an
    AUC of a test set with one class only comes out as)."""
    if auc is None:
        return None
    auc = float(auc)
    if auc < 0:
        return None
    if not auc <= 1.0:
        raise ValueError("test_auc %r is not in [0, 1]" % auc)
    return auc


def done(test_accuracy=None, test_loss=None, evaluate=None, test_auc=None):
    """This worker is done: reports its figures, then waits until the job
    ends. Every argument is optional. ``evaluate``: a function returning
    (accuracy, loss), (accuracy, loss, auc), or a loss, run on the final
    weights (in the model) when the coordinator asks this worker for the
    job's final evaluation; without it, the figures given are the final
    ones. ``test_auc`` (a two-class model's, in [0, 1]) goes with an
    accuracy into the job's result (grpsctl, the result JSON). With no
    accuracy at all (a regression, a language model), the job completes
    without a final evaluation (its message says so). A program that ends
    without calling done() is done as if it had, with no figures (a Horovod
    script)."""
    p = _require_process()
    w = _require_worker()
    test_auc = _check_auc(test_auc)
    p.finished = True
    # A backward() after the last step(): the step is not this rank's, and
    # its parts pushed early end before the rank is done.
    w.abandon_step()
    if test_accuracy is not None or test_loss is not None or test_auc is not None:
        p.curve.row(w.step_count, p.samples, None, test_accuracy, test_loss, test_auc)
    w.done(None if test_accuracy is None else float(test_accuracy),
           None if test_loss is None else float(test_loss), test_auc)
    # Asked again only after a rank came back and training was done again
    # (the evaluation given before is not final any more).
    while w.await_end():
        try:
            if evaluate is not None:
                w.pull_final(p.model.flat.numpy())
                p.model.weights_to_params()
                figures = evaluate()
                test_auc = None
                if isinstance(figures, (tuple, list)) and len(figures) == 3:
                    test_accuracy, test_loss, test_auc = figures
                    test_auc = _check_auc(test_auc)
                elif isinstance(figures, (tuple, list)):
                    test_accuracy, test_loss = figures
                else:
                    test_accuracy, test_loss = None, figures
            if test_accuracy is None:
                w.done(None, None if test_loss is None else float(test_loss), declined=True)
            else:
                w.done(float(test_accuracy), None if test_loss is None else float(test_loss),
                       test_auc)
        except JobEnded:
            # The job completed while this worker was asked (the figures a
            # done() carried, this one's or another rank's, were final).
            return


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


# The dtypes a sparse table's ids may have (nn.Embedding takes int32 and
# int64; any integer names a row exactly).
_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class _SparseTable(torch.nn.Module):
    """Rows of a grps sparse table: the rows a batch reads are pulled, their
    gradients pushed at the optimizer's step."""

    def __init__(self, table, dim):
        super().__init__()
        self.table = table
        self.dim = int(dim)
        self._pending = []  # (unique ids, rows tensor with grad) of this step
        p = _require_process()
        if p.worker is not None:
            self._check_dim(p.worker.tables)
        p.tables.append(self)

    def _check_dim(self, job_tables):
        """Raises ValueError if the job's table of this name has rows of
        another dim. `job_tables`: the job's (name, rows, dim), known once
        the worker joined; checked then (or here, for a module made after),
        not at the first forward. A name the job lacks is the pull's to say."""
        for name, rows, dim in job_tables:
            if name == self.table and dim != self.dim:
                raise ValueError("gt.%s(%r, %d): table %r has rows of %d floats "
                                 "(--sparse_tables %s:%d:%d)"
                                 % (type(self).__name__, self.table, self.dim, name, dim, name,
                                    rows, dim))

    def _rows(self, ids):
        """The rows of `ids` (any shape, an integer dtype) as a leaf tensor
        that trains, and the inverse map from ids to them."""
        if ids.dtype not in _ID_DTYPES:
            # nn.Embedding's kind of error: a float id is no row, and
            # rounding it would read a row the program did not name.
            raise RuntimeError("gt.%s(%r, %d): ids must be of an integer dtype, not %s"
                               % (type(self).__name__, self.table, self.dim, ids.dtype))
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
