"""DistributedOptimizer: horovod.torch's optimizer wrapper over shoal's async runtime.

A hook on every parameter's gradient accumulator submits that gradient, by
parameter name, as an in-place shoal_iallreduce as soon as backward has
produced it, so communication overlaps the rest of backward; step() (or
synchronize()) waits for all of them. The compressor and its options travel
with each request and run in C, keyed by the parameter's name.
"""
import warnings
from contextlib import contextmanager

import torch

import shoal
from shoal import ShoalError

from .compression import Compression, runs_in_python
from .mpi_ops import (Average, Adasum, Sum, _OPS, _check_tensor, _comm_of, _op, _raise, _scale, global_process_set,
                      size, sparse_allreduce_async)
from .functions import broadcast_object


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False, process_set=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._python_codec = runs_in_python(compression)
        self.process_set = global_process_set if process_set is None else process_set
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%d.%d" % (i, j), v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                             "model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: %s"
                             % ", ".join(dups))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                             "Python object ids: %s" % ", ".join(str(i) for i in unnamed))

        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._requests = {}      # parameter (or group tuple) -> [Request] in flight
        self._grad_accs = []
        self._requires_update = set()
        self._plans = {}         # parameter -> its gradient's prepared allreduce (shoal.PreparedAllreduce)
        self._dense = {}         # parameter with sparse gradients -> the dense buffer sparse_as_dense reduces
        self._synchronized = False
        self._should_synchronize = True
        self._p_to_group = {}
        self._group_ready = {}
        self._groups = groups
        if self.process_set.included() and size() > 1:
            self._register_hooks()

    @staticmethod
    def find_duplicates(lst):
        return {x for x in lst if lst.count(x) > 1}

    def load_state_dict(self, *args, **kwargs):
        self._requests = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if self._groups is not None:
            # The same groups on every rank: order the parameters as rank 0 names them.
            order = broadcast_object([self._parameter_names[p] for p in trainable], root_rank=self.process_set.ranks[0],
                                     name="DistributedOptimizer.groups", process_set=self.process_set)
            by_name = {self._parameter_names[p]: p for p in trainable}
            ordered = [by_name[n] for n in order if n in by_name]
            if isinstance(self._groups, list):
                groups, seen = [], set()
                for g in self._groups:
                    members = tuple(p for p in ordered if any(p is q for q in g))
                    if members:
                        groups.append(members)
                        seen.update(id(p) for p in members)
                groups += [(p,) for p in ordered if id(p) not in seen]
            else:
                n = max(1, min(int(self._groups), len(ordered)))
                groups = [tuple(ordered[i::n]) for i in range(n)]
                groups = [g for g in groups if g]
            for g in groups:
                for p in g:
                    self._p_to_group[p] = g
                self._group_ready[g] = 0
        for p in trainable:
            self._requires_update.add(p)
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(p))
            self._grad_accs.append(accumulator)

    def _submit(self, p):
        """Starts p's gradient allreduce; returns its entry (request, finish, sparse): finish() runs
        after the request completed. A sparse gradient without sparse_as_dense has no request: its
        allgathers run in synchronize() (sparse=True), in parameter-name order on every rank."""
        grad = p.grad
        if grad is not None and grad.is_sparse:
            if not self.sparse_as_dense:
                if self.op not in (Average, Sum):
                    raise ValueError("parameter '%s' has a sparse gradient, which op %r cannot reduce; pass "
                                     "sparse_as_dense=True" % (self._parameter_names[p], self.op))
                return None, lambda: self._sparse_allreduce(p), True
            # As Horovod: reduce it densely, give the optimizer a sparse gradient again.
            dense = self._dense.get(p)
            if dense is None or dense.shape != grad.shape or dense.dtype != grad.dtype or dense.device != grad.device:
                dense = self._dense[p] = torch.zeros(grad.shape, dtype=grad.dtype, device=grad.device)
            else:
                dense.zero_()
            dense.add_(grad)
            tensor = dense
        else:
            if grad is None:
                # Another rank may have a gradient for p: contribute zeros under the same name.
                p.grad = grad = torch.zeros_like(p)
            elif not grad.is_contiguous():
                p.grad = grad = grad.contiguous()
            tensor = grad
        if self.op == Average:
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            prescale, postscale = 1.0, 1.0
        _scale(tensor, prescale)
        codec = None
        if self._python_codec:
            # A user's Horovod-style compressor: compress() in Python, allreduce what it returns.
            compressed, ctx = self._compression.compress(tensor)
            codec = (compressed.contiguous(), ctx)
            work = codec[0]
        else:
            work = tensor
        # The steady state: the gradient is still the buffer its plan describes (zero_grad zeroes
        # it in place), so nothing is checked, described or encoded again; only what differs from
        # the plan goes the long way (_prepare).
        comm = _comm_of(self.process_set)
        plan = self._plans.get(p)
        if plan is None or plan.comm is not comm or not plan.matches(work):
            plan = self._prepare(p, work, comm)
        try:
            request = plan.comm._submit_matched(plan, work)
        except ShoalError as error:
            _raise(error)

        def finish():
            result = work
            if codec is not None:
                result = self._compression.decompress(work, codec[1])
            _scale(result, postscale)
            if codec is None:
                decompressed = self._compression.decompress(result, None)
                if decompressed is not result:
                    result = decompressed
            if tensor is not p.grad:  # sparse_as_dense: the optimizer gets a sparse gradient again
                p.grad.zero_().add_(result.to_sparse(p.grad.sparse_dim()))
            elif result is not tensor:
                if result.shape == tensor.shape:
                    tensor.copy_(result)
                else:
                    tensor.set_(result)
        return request, finish, False

    def _sparse_allreduce(self, p):
        aggregated = sparse_allreduce_async(p.grad, self._parameter_names[p], self.op, self.process_set)()
        p.grad.zero_().add_(aggregated)

    def _prepare(self, p, tensor, comm):
        """The prepared in-place allreduce of tensor (p's gradient, dense, as it is now; or what a
        Python compressor made of it), checked and described once for the steps that reuse it."""
        _check_tensor(tensor, "the gradient of %s" % self._parameter_names[p], cuda_ok=True)
        if not tensor.is_contiguous():
            raise ValueError("the gradient of %s is not contiguous" % self._parameter_names[p])
        compressor, options = ("none", None) if self._python_codec else self._compression.shoal_compressor(tensor)
        try:
            plan = comm.prepare_iallreduce(tensor, self._parameter_names[p], op=_OPS[self.op],
                                           compressor=compressor, compressor_options=options)
        except ShoalError as error:
            _raise(error)
        self._plans[p] = plan
        return plan

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._requests and self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                     "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._requests.setdefault(p, None)
                return
            group = self._p_to_group.get(p)
            if group is None:
                self._requests[p] = [self._submit(p)]
                return
            self._group_ready[group] += 1
            self._requests.setdefault(p, None)
            if self._group_ready[group] == len(group):
                for q in group:
                    self._requests.pop(q, None)
                self._requests[group] = [self._submit(q) for q in group]
                self._group_ready[group] = 0
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those backward did not produce)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        submitted = set()
        for key, requests in self._requests.items():
            if requests is not None:
                submitted.update(key if isinstance(key, tuple) else (key,))
        for p in sorted(self._requires_update - submitted, key=lambda q: self._parameter_names[q]):
            self._requests.pop(p, None)
            self._requests[p] = [self._submit(p)]
        for key in list(self._requests):
            if self._requests[key] is None:
                self._requests[key] = [self._submit(key)]
        entries = [(key if isinstance(key, tuple) else (key,), requests) for key, requests in self._requests.items()]
        try:
            shoal.wait_all([request for _, requests in entries for request, _, _ in requests if request is not None])
            for _, requests in entries:
                for request, finish, sparse in requests:
                    if not sparse:
                        finish()
            # Sparse gradients (allgathered): in one order on every rank, the parameters' names.
            sparse = sorted(((self._parameter_names[q], finish) for params, requests in entries
                             for q, (_, finish, is_sparse) in zip(params, requests) if is_sparse),
                            key=lambda item: item[0])
            for _, finish in sparse:
                finish()
        except ShoalError as error:
            self._requests.clear()
            _raise(error)
        finally:
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            for g in self._group_ready:
                self._group_ready[g] = 0
        self._requests.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize (use after an explicit synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._requests:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None):
    """Wraps a torch.optim.Optimizer so that step() applies gradients averaged (op=Average) over all ranks.

    As in Horovod: named_parameters names the allreduces (usually model.named_parameters());
    compression picks the compressor (Compression.none, fp16, bf16, topk(...), powersgd(...),
    sketch(...)); backward_passes_per_step accumulates gradients locally; gradient_predivide_factor
    splits the averaging around the sum; num_groups/groups submit parameters in groups.
    synchronize() and skip_synchronize() work as in Horovod. Sparse gradients are allgathered
    (or, with sparse_as_dense, allreduced densely and handed back sparse); a user's Horovod-style
    compressor runs its compress()/decompress() in Python around a plain allreduce; process_set
    reduces over that set only (ranks outside it step on their own gradients), as in Horovod."""
    if op == Adasum:
        _op(op)  # raises: Adasum is not implemented
    _op(op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    if isinstance(groups, list):
        seen = set()
        for g in groups:
            for p in g:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if process_set is not None and not hasattr(process_set, "included"):
        raise TypeError("process_set must be a hvd.ProcessSet, got %s" % type(process_set).__name__)
    if process_set is not None and process_set.process_set_id is None:
        raise ValueError("process set %s was not registered: call hvd.add_process_set() on every rank"
                         % (process_set.ranks,))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
