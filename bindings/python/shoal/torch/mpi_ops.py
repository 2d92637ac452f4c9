"""Horovod's tensor operations (horovod.torch.mpi_ops) over shoal's async runtime.

Every named operation is a shoal request (shoal_iallreduce, shoal_iallgather,
shoal_ibroadcast): the runtime negotiates one order across ranks, fuses small
tensors, writes the timeline and reports stalls and mismatches (shape, dtype,
op, compressor) as errors on every rank. Handles are integers, as in Horovod;
the tensors of a handle stay alive until synchronize().
"""
import itertools
import math
import threading

import torch

import shoal
from shoal import ShoalError
from shoal._lib import lib as _clib

from .compression import Compression, runs_in_python

# Horovod's op constants (horovod/common/basics.py), same values.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}


class HorovodInternalError(ShoalError):
    """Raised where Horovod raises HorovodInternalError (a failed collective); also a ShoalError."""

    def __init__(self, error):
        super().__init__(error.status, error.message)


def _comm():
    if not shoal.is_initialized():
        raise ValueError("shoal has not been initialized; use hvd.init().")
    return shoal.communicator()


# ---- process sets (Horovod's hvd.ProcessSet; docs/groups.md) ------------------------------------------------
class ProcessSet:
    """A subset of the ranks (global ranks, kept sorted, as in Horovod). Registered by add_process_set
    (or init(process_sets=...)), collectively on every rank; then process_set= of allreduce, allgather,
    broadcast and reducescatter runs the operation over those ranks only, on a shoal communicator
    of their own."""

    def __init__(self, ranks):
        ranks = sorted(set(int(r) for r in ranks))
        if not ranks:
            raise ValueError("ProcessSet: list at least one rank")
        self.ranks = ranks
        self.process_set_id = None
        self._comm = None

    def _communicator(self):
        if self.process_set_id is None:
            raise ValueError("process set %s was not registered: call hvd.add_process_set() on every rank" %
                             (self.ranks,))
        comm = _comm() if self.process_set_id == 0 else self._comm
        if comm is None:
            raise ValueError("this rank (%d) is not in process set %d %s" % (rank(), self.process_set_id,
                                                                              self.ranks))
        return comm

    def included(self):
        return self.process_set_id == 0 or self._comm is not None

    def rank(self):
        return self._communicator().rank

    def size(self):
        return self._communicator().size

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet([0])  # ranks filled in by init()
global_process_set.process_set_id = 0
_process_sets = {}
_next_process_set_id = itertools.count(1)


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of ranks): collective, every rank in the same order.
    Returns the registered ProcessSet."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("process set %s is already registered (id %d)" % (process_set.ranks,
                                                                              process_set.process_set_id))
    try:
        process_set._comm = _comm().create_group(process_set.ranks)
    except ShoalError as error:
        _raise(error)
    process_set.process_set_id = next(_next_process_set_id)
    _process_sets[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters it and frees its communicator (local; every rank should do it)."""
    if process_set.process_set_id in (None, 0):
        return False
    _process_sets.pop(process_set.process_set_id, None)
    if process_set._comm is not None:
        process_set._comm.finalize()
    process_set._comm = None
    process_set.process_set_id = None
    return True


def _comm_of(process_set):
    if process_set is None or process_set is global_process_set:
        return _comm()
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be a hvd.ProcessSet, got %s" % type(process_set).__name__)
    return process_set._communicator()


def init(comm=None, process_sets=None):
    """Starts shoal from the launcher's environment (shoalrun, mpirun, srun) and registers
    process_sets (ProcessSet objects or rank lists; "dynamic", as in Horovod, registers none now:
    add_process_set() works at any time in shoal). comm= takes a list of ranks only when it lists
    every rank (an MPI communicator, or a subset, is not supported). Calling it again is harmless."""
    if comm is not None and not (isinstance(comm, (list, tuple, range))
                                 and all(isinstance(r, int) and not isinstance(r, bool) for r in comm)):
        raise NotImplementedError("shoal.torch.init: comm= (an MPI communicator) is not supported by shoal; launch "
                                  "every rank, call init(), and use process_sets= for subsets")
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError("init: process_sets must be a list of hvd.ProcessSet (or rank lists) or \"dynamic\", "
                             "got %r" % (process_sets,))
        process_sets = None
    shoal.init()
    global_process_set.ranks = list(range(_comm().size))
    if comm is not None and sorted(comm) != global_process_set.ranks:
        raise NotImplementedError("shoal.torch.init: comm=%s lists a subset of the %d ranks; shoal's global set is "
                                  "every launched rank: launch only those ranks, or use process_sets=[hvd.ProcessSet("
                                  "%s)] and process_set= on the operations" % (list(comm), _comm().size, list(comm)))
    for process_set in process_sets or []:
        add_process_set(process_set)


def shutdown():
    for process_set in list(_process_sets.values()):
        remove_process_set(process_set)
    shoal.finalize()
    _handle_map.clear()


def is_initialized():
    return shoal.is_initialized()


def rank():
    return _comm().rank


def size():
    return _comm().size


def local_rank():
    return _comm().local_rank


def local_size():
    return _comm().local_size


def cross_rank():
    return _comm().rank // max(_comm().local_size, 1)


def cross_size():
    return max(_comm().size // max(_comm().local_size, 1), 1)


def is_homogeneous():
    return _comm().size % max(_comm().local_size, 1) == 0


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    return 1 if _clib.shoal_built_with(b"nccl") else 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """Whether libshoal was built with CUDA: then allreduce, allgather, broadcast, reducescatter and
    alltoall (blocking and async) take CUDA tensors (over NCCL; see docs/gpu.md for the stream rules)."""
    return bool(_clib.shoal_built_with(b"cuda"))


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Horovod's dynamic timeline: shoal has no such switch. Its timeline is SHOAL_TIMELINE=<file>
    in the environment when the runtime starts (rank 0 writes a Chrome trace; docs/diagnostics.md)."""
    raise NotImplementedError("start_timeline: shoal cannot start a timeline from Python; set SHOAL_TIMELINE=%s in "
                              "the environment of every rank before the first collective (rank 0 writes it)"
                              % (file_path,))


def stop_timeline():
    raise NotImplementedError("stop_timeline: shoal's timeline (SHOAL_TIMELINE=<file> in the environment) records "
                              "until the runtime stops (hvd.shutdown() or exit)")


# ---- handles ---------------------------------------------------------------------------------------------
_handle_map = {}
_handle_counter = itertools.count(1)
_name_counters = {}
_lock = threading.Lock()


class _Done:
    """A handle whose work ran at submission (collectives the runtime has no async form of)."""

    def __init__(self, value):
        self.value = value
        self.done = True

    def test(self):
        return True

    def wait(self, timeout_s=None):
        return self.value


class _Group:
    """Several requests (shoal Requests, or _Done ones) behind one handle (grouped ops)."""

    def __init__(self, requests):
        self.requests = requests

    def test(self):
        return all(r.test() for r in self.requests)

    def wait(self, timeout_s=None):
        shoal.wait_all([r for r in self.requests if isinstance(r, shoal.Request)], timeout_s)
        return [r.wait() for r in self.requests]


def _new_handle(request, finish=None):
    handle = next(_handle_counter)
    _handle_map[handle] = (request, finish)
    return handle


def _group_handles(handles):
    """One handle for several (grouped ops): synchronize() returns the list of their results."""
    entries = [_handle_map.pop(h) for h in handles]

    def finish(results):
        return [f(r) if f else r for r, (_, f) in zip(results, entries)]
    return _new_handle(_Group([r for r, _ in entries]), finish)


def _auto_name(kind, name):
    if name is not None:
        if not isinstance(name, str):
            raise TypeError("name must be a str, got %s" % type(name).__name__)
        return name
    with _lock:
        n = _name_counters.get(kind, 0)
        _name_counters[kind] = n + 1
    return "%s.noname.%d" % (kind, n)


def _op(op, average=None):
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = Average
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented in shoal; use op=hvd.Average or hvd.Sum (shoal's "
                                  "compressors, e.g. Compression.powersgd, are its way to cut traffic)")
    if op not in _OPS:
        raise ValueError("op must be one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product, got %r" % (op,))
    return op


def _check_tensor(tensor, what="tensor", cuda_ok=False):
    """A torch tensor shoal.torch can take: CPU memory, or (cuda_ok: every operation of this module
    passes it) CUDA memory when libshoal was built with CUDA."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.device.type == "cpu":
        return
    if tensor.device.type == "cuda" and cuda_ok and cuda_built():
        return
    if tensor.device.type == "cuda" and cuda_ok:
        raise TypeError("%s is on %s, but this libshoal was built without CUDA (shoal.torch.cuda_built() is False); "
                        "shoal.torch takes CPU tensors" % (what, tensor.device))
    if tensor.device.type == "cuda":
        raise TypeError("%s is on %s; this operation takes CPU tensors (CUDA tensors: allreduce, allgather with the "
                        "same first extent on every rank, broadcast, reducescatter and alltoall)"
                        % (what, tensor.device))
    raise TypeError("%s is on %s; shoal.torch takes CPU tensors" % (what, tensor.device))


def _scale(tensor, factor):
    if factor != 1.0:
        if tensor.dtype.is_floating_point:
            tensor.mul_(factor)
        else:
            tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def _raise(error):
    raise HorovodInternalError(error) from None


def _postscaler(factor):
    """A handle's finish that scales the result by factor in place (None where factor is 1)."""
    if factor == 1.0:
        return None

    def finish(result):
        _scale(result, factor)
        return result
    return finish


# ---- allreduce -------------------------------------------------------------------------------------------
def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, compression, process_set=None):
    _check_tensor(tensor, cuda_ok=True)
    comm = _comm_of(process_set)
    name = _auto_name("allreduce", name)
    if output is not tensor:
        output.copy_(tensor)
    _scale(output, prescale_factor)
    if runs_in_python(compression):
        # A user's Horovod-style compressor: allreduce what compress() returns, hand the
        # result to decompress() and write it into output (as Horovod does around its op).
        compressed, ctx = compression.compress(output)
        work = compressed.contiguous()
        scale = _postscaler(postscale_factor)

        def finish(result):
            value = compression.decompress(result, ctx)
            if value.data_ptr() != output.data_ptr():
                output.copy_(value)
            return scale(output) if scale else output
        try:
            request = comm.iallreduce(work, name, out=work, op=_OPS[op], compressor="none")
        except ShoalError as error:
            _raise(error)
        return _new_handle(request, finish)
    compressor, options = ("none", None)
    if op in (Average, Sum):
        compressor, options = compression.shoal_compressor(output)
    finish = _postscaler(postscale_factor)
    try:
        request = comm.iallreduce(output, name, out=output, op=_OPS[op], compressor=compressor,
                                     compressor_options=options)
    except ShoalError as error:
        _raise(error)
    return _new_handle(request, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=Compression.none):
    """Starts an out-of-place allreduce (tensor is not modified); returns a handle for poll/synchronize."""
    op = _op(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, compression, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None, compression=Compression.none):
    """Starts an in-place allreduce of tensor; returns a handle."""
    op = _op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, compression, process_set)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression, process_set):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                                           process_set=process_set, compression=compression))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Averages (op=Average, the default) or reduces tensor over all ranks; returns a new tensor.
    Differentiable: the gradient is the same allreduce of the output's gradient."""
    op = _op(op, average)
    _check_tensor(tensor, cuda_ok=True)
    if runs_in_python(compression):
        # As Horovod: compress() outside the differentiable allreduce, decompress() after it.
        compressed, ctx = compression.compress(tensor)
        reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, Compression.none,
                                   process_set)
        return compression.decompress(reduced, ctx)
    return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, compression, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None, compression=Compression.none):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set=process_set, compression=compression))


# ---- grouped allreduce -----------------------------------------------------------------------------------
def _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, compression, process_set=None):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allreduce: tensors is empty")
    name = _auto_name("grouped_allreduce", name)
    handles = [_allreduce_async(t, o, "%s.%d" % (name, i), op, prescale_factor, postscale_factor, compression,
                                process_set)
               for i, (t, o) in enumerate(zip(tensors, outputs))]
    return _group_handles(handles)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None, compression=Compression.none):
    op = _op(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, compression, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None, compression=Compression.none):
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped(tensors, tensors, name, op, prescale_factor, postscale_factor, compression, process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set=process_set, compression=compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, compression=Compression.none):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set=process_set, compression=compression))


# ---- allgather -------------------------------------------------------------------------------------------
def allgather_async(tensor, name=None, process_set=None):
    """Concatenates every rank's tensor along dim 0 (the first extent may differ per rank).
    Equal first extents run as one async request; unequal ones run at submission (shoal has no
    async allgatherv), and the handle is then already complete."""
    _check_tensor(tensor, cuda_ok=True)
    name = _auto_name("allgather", name)
    tensor = tensor.contiguous()
    if tensor.dim() == 0:
        raise ValueError("allgather: tensor is a scalar; pass a tensor with at least one dimension")
    comm = _comm_of(process_set)
    try:
        shape = torch.tensor([tensor.shape[0]] + list(tensor.shape[1:]) + [-1] * (8 - tensor.dim()),
                             dtype=torch.int64)
        shapes = comm.iallgather(shape, name + ".shape").wait().view(comm.size, -1)
        if (shapes[:, 1:] != shapes[0, 1:]).any():
            raise ShoalError(-4, "allgather '%s': ranks passed tensors whose shapes differ beyond dim 0: %s" % (
                name, [[int(v) for v in row if v >= 0] for row in shapes.tolist()]))
        rows = [int(r) for r in shapes[:, 0]]
        if all(r == rows[0] for r in rows):
            return _new_handle(comm.iallgather(tensor, name))
        if tensor.device.type != "cpu":
            raise TypeError("allgather '%s': first extents differ between ranks (%s), and CUDA tensors take the "
                            "async allgather only (shoal has no CUDA allgatherv): pad to one extent, or pass CPU "
                            "tensors" % (name, rows))
        return _new_handle(_Done(comm.allgatherv(tensor, rows)))
    except ShoalError as error:
        _raise(error)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set)
        me = _comm_of(ctx.process_set).rank
        offset = int(dims[:me].sum()) if me else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=None):
    _check_tensor(tensor, cuda_ok=True)
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Horovod's grouped allgather: one handle for the allgathers of every tensor (each named
    <name>.<i>); synchronize() returns the list of results."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allgather: tensors is empty")
    name = _auto_name("grouped_allgather", name)
    return _group_handles([allgather_async(t, "%s.%d" % (name, i), process_set) for i, t in enumerate(tensors)])


def grouped_allgather(tensors, name=None, process_set=None):
    """The allgather of every tensor (a list), each differentiable as allgather()."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allgather: tensors is empty")
    name = _auto_name("grouped_allgather", name)
    return [allgather(t, "%s.%d" % (name, i), process_set) for i, t in enumerate(tensors)]


def sparse_allreduce_async(tensor, name, op, process_set=None):
    """Horovod's allreduce of a sparse COO tensor: every rank's indices and values are allgathered
    (<name>.indices, <name>.values); returns a function that waits and gives the sparse result
    (values divided by the set's size for op=Average; duplicate indices stay, to be summed)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async: tensor must be a sparse COO torch.Tensor")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async: op must be hvd.Average or hvd.Sum (allreduce it densely, "
                         "sparse_as_dense=True, for other ops), got %r" % (op,))
    name = _auto_name("allreduce", name)
    local = tensor.coalesce()
    indices_handle = allgather_async(local.indices().t().contiguous(), name="%s.indices" % name,
                                     process_set=process_set)
    values_handle = allgather_async(local.values().contiguous(), name="%s.values" % name, process_set=process_set)

    def result():
        indices = synchronize(indices_handle)
        values = synchronize(values_handle)
        if op == Average:
            values = values / _comm_of(process_set).size
        return torch.sparse_coo_tensor(indices.t(), values, tensor.shape)
    return result


# ---- broadcast -------------------------------------------------------------------------------------------
def _broadcast_async(tensor, output, root_rank, name, process_set=None):
    _check_tensor(tensor, cuda_ok=True)
    name = _auto_name("broadcast", name)
    comm = _comm_of(process_set)
    if process_set is not None and process_set is not global_process_set:
        # root_rank is a global rank, as the set's ranks are: its place in the set is its rank there.
        if root_rank not in process_set.ranks:
            raise ValueError("broadcast: root_rank %r is not in process set %s" % (root_rank, process_set.ranks))
        root_rank = process_set.ranks.index(root_rank)
    try:
        return _new_handle(comm.ibroadcast(tensor, name, root=root_rank, out=output))
    except ShoalError as error:
        _raise(error)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    return _broadcast_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format), root_rank, name,
                            process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    _check_tensor(tensor, cuda_ok=True)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- reducescatter, alltoall -----------------------------------------------------------------------------
def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor over all ranks and gives rank r its share of dim 0 (the first
    dim % size ranks get one row more, as in Horovod): a named request of the async runtime
    (shoal_ireduce_scatter), negotiated and run in order with the other requests. CUDA tensors (a
    CUDA build) stay on their device: ncclReduceScatter when dim 0 splits evenly, else the CUDA
    allreduce and this rank's rows."""
    _check_tensor(tensor, cuda_ok=True)
    op = _op(op)
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError("reducescatter: unsupported op %r" % (op,))
    if tensor.dim() == 0:
        raise ValueError("reducescatter: tensor is a scalar; pass a tensor with at least one dimension")
    comm = _comm_of(process_set)
    work = tensor.detach().contiguous()
    if prescale_factor != 1.0:
        work = work.clone()
        _scale(work, prescale_factor)
    name = _auto_name("reducescatter", name)
    finish = _postscaler(postscale_factor)
    try:
        request = comm.ireduce_scatter(work, name, op=_OPS[op])
    except ShoalError as error:
        _raise(error)
    return _new_handle(request, finish)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        ctx.process_set = process_set
        # An uneven split gives the ranks gradients of different first extents, which the CUDA
        # allgather does not take (it needs one shape on every rank): those gather on the host.
        ctx.uneven_cuda = tensor.is_cuda and tensor.shape[0] % _comm_of(process_set).size != 0
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.clone()
        if ctx.op == Sum:
            grad_output *= _comm_of(ctx.process_set).size
        grad_output *= ctx.prescale_factor * ctx.postscale_factor
        if ctx.uneven_cuda:
            grad = allgather(grad_output.cpu(), process_set=ctx.process_set).to(grad_output.device)
        else:
            grad = allgather(grad_output, process_set=ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    _check_tensor(tensor, cuda_ok=True)
    return _Reducescatter.apply(tensor, name, _op(op), prescale_factor, postscale_factor, process_set)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Horovod's grouped reducescatter: one handle for the reducescatters of every tensor (each
    named <name>.<i>); synchronize() returns the list of this rank's shares."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped reducescatter: tensors is empty")
    name = _auto_name("grouped_reducescatter", name)
    return _group_handles([reducescatter_async(t, "%s.%d" % (name, i), op, process_set, prescale_factor,
                                               postscale_factor) for i, t in enumerate(tensors)])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of every tensor (a list), each differentiable as reducescatter()."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped reducescatter: tensors is empty")
    name = _auto_name("grouped_reducescatter", name)
    return [reducescatter(t, "%s.%d" % (name, i), compression, op, process_set, prescale_factor, postscale_factor)
            for i, t in enumerate(tensors)]


def _alltoall_now(tensor, splits, process_set=None):
    """(received rows, received splits as an int32 CPU tensor), run at once (blocking C call: a CUDA
    tensor's rows arrive in a tensor on its device, sized from the exchanged splits)."""
    _check_tensor(tensor, cuda_ok=True)
    if tensor.dim() == 0:
        raise ValueError("alltoall: tensor is a scalar; pass a tensor with at least one dimension")
    if splits is not None:
        splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    try:
        out, received = _comm_of(process_set).alltoall(tensor.contiguous(), splits)
    except ShoalError as error:
        _raise(error)
    return out, torch.tensor(received, dtype=torch.int32)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = _alltoall_now(tensor, splits, process_set)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        # The gradient goes back the way the rows came: rank p's rows return to rank p.
        grad, _ = _alltoall_now(grad_output.contiguous(), ctx.received, ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Horovod's alltoall: rank r sends splits[p] rows of tensor (dim 0, in order) to rank p and
    receives every rank's rows for it, concatenated in rank order. splits=None splits dim 0
    evenly. Returns the received tensor, and with splits also the received splits (an int32
    tensor on the CPU, as Horovod >= 0.26). CUDA tensors (a CUDA build) travel over NCCL."""
    _check_tensor(tensor, cuda_ok=True)
    out, received = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """As alltoall, but returns a handle for synchronize(): a named request of the async runtime
    (shoal_ialltoall), negotiated and run in order with the other requests. Not differentiable
    (as in Horovod). Rows of no elements (shape (n, 0, ...)) run at submission instead. A CUDA
    tensor's rows arrive in device memory the request holds; synchronize() returns them copied
    into a tensor on its device (the library copies: shoal_request_alltoall_copy)."""
    _check_tensor(tensor, cuda_ok=True)
    if tensor.dim() == 0:
        raise ValueError("alltoall: tensor is a scalar; pass a tensor with at least one dimension")
    if splits is not None:
        splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if math.prod(tensor.shape[1:]) == 0:
        return _new_handle(_Done(alltoall(tensor, splits, name, process_set)))
    comm = _comm_of(process_set)
    name = _auto_name("alltoall", name)
    try:
        request = comm.ialltoall(tensor.detach().contiguous(), name, splits)
    except ShoalError as error:
        _raise(error)

    def finish(result):
        out, received = result
        return out if splits is None else (out, torch.tensor(received, dtype=torch.int32))
    return _new_handle(request, finish)


# ---- completion --------------------------------------------------------------------------------------------
def _lookup(handle):
    entry = _handle_map.get(handle)
    if entry is None:
        raise ValueError("handle %r is unknown or was already synchronized" % (handle,))
    return entry


def poll(handle):
    """True once the operation behind handle completed (synchronize() then returns at once)."""
    request, _ = _lookup(handle)
    try:
        return request.test()
    except ShoalError as error:
        _raise(error)


def synchronize(handle):
    """Waits (up to SHOAL_TIMEOUT_S) for the operation and returns its output tensor."""
    request, finish = _lookup(handle)
    try:
        result = request.wait()
    except ShoalError as error:
        if error.status != -2:  # a timeout leaves the request pending: keep its handle
            _handle_map.pop(handle, None)
        _raise(error)
    _handle_map.pop(handle, None)
    return finish(result) if finish else result


def barrier(process_set=None):
    try:
        _comm_of(process_set).barrier()
    except ShoalError as error:
        _raise(error)


def join(device=-1, timeout_s=None):
    """Horovod's join, for uneven data: a rank that ran out of batches calls join() and, until every
    rank has joined, keeps taking part in the other ranks' named allreduces with zeros (Average still
    divides by size()). Returns the rank that joined last. Allgather and broadcast submitted while a
    rank has joined fail, as in Horovod. device is accepted for Horovod's signature (shoal's runtime
    runs on the host). timeout_s (shoal's addition): None = SHOAL_TIMEOUT_S; after a timeout the rank
    stays joined and join() again keeps waiting."""
    try:
        return _comm().join(timeout_s)
    except ShoalError as error:
        _raise(error)
