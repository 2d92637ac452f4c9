"""Horovod's tensor operations (horovod.torch.mpi_ops) over shoal's async runtime.

Every named operation is a shoal request (shoal_iallreduce, shoal_iallgather,
shoal_ibroadcast): the runtime negotiates one order across ranks, fuses small
tensors, writes the timeline and reports stalls and mismatches (shape, dtype,
op, compressor) as errors on every rank. Handles are integers, as in Horovod;
the tensors of a handle stay alive until synchronize().
"""
import itertools
import threading
import time

import torch

import shoal
from shoal import ShoalError

from .compression import Compression

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


def init(comm=None, process_sets=None):
    """Starts shoal from the launcher's environment (shoalrun, mpirun, srun). comm and
    process_sets (Horovod's MPI communicator and process sets) are not supported."""
    if comm is not None or process_sets is not None:
        raise NotImplementedError("shoal.torch.init: comm= and process_sets= (MPI communicators, process sets) "
                                  "are not supported by shoal; launch every rank and call init()")
    shoal.init()


def shutdown():
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
    return 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False


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
    """Several requests behind one handle (grouped ops)."""

    def __init__(self, requests):
        self.requests = requests

    def test(self):
        return all(r.test() for r in self.requests)

    def wait(self, timeout_s=None):
        return shoal.wait_all(self.requests, timeout_s)


def _new_handle(request, finish=None):
    handle = next(_handle_counter)
    _handle_map[handle] = (request, finish)
    return handle


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


def _check_tensor(tensor, what="tensor"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.device.type != "cpu":
        raise TypeError("%s is on %s; shoal.torch takes CPU tensors" % (what, tensor.device))


def _scale(tensor, factor):
    if factor != 1.0:
        if tensor.dtype.is_floating_point:
            tensor.mul_(factor)
        else:
            tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def _raise(error):
    raise HorovodInternalError(error) from None


# ---- allreduce -------------------------------------------------------------------------------------------
def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, compression):
    _check_tensor(tensor)
    name = _auto_name("allreduce", name)
    if output is not tensor:
        output.copy_(tensor)
    _scale(output, prescale_factor)
    compressor, options = ("none", None)
    if op in (Average, Sum):
        compressor, options = compression.shoal_compressor(output)
    finish = None
    if postscale_factor != 1.0:
        def finish(result):
            _scale(result, postscale_factor)
            return result
    try:
        request = _comm().iallreduce(output, name, out=output, op=_OPS[op], compressor=compressor,
                                     compressor_options=options)
    except ShoalError as error:
        _raise(error)
    return _new_handle(request, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None, compression=Compression.none):
    """Starts an out-of-place allreduce (tensor is not modified); returns a handle for poll/synchronize."""
    op = _op(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, compression)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None, compression=Compression.none):
    """Starts an in-place allreduce of tensor; returns a handle."""
    op = _op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, compression)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                                           compression=compression))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor), None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Averages (op=Average, the default) or reduces tensor over all ranks; returns a new tensor.
    Differentiable: the gradient is the same allreduce of the output's gradient."""
    op = _op(op, average)
    _check_tensor(tensor)
    return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, compression)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None, compression=Compression.none):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        compression=compression))


# ---- grouped allreduce -----------------------------------------------------------------------------------
def _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, compression):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allreduce: tensors is empty")
    name = _auto_name("grouped_allreduce", name)
    handles = [_allreduce_async(t, o, "%s.%d" % (name, i), op, prescale_factor, postscale_factor, compression)
               for i, (t, o) in enumerate(zip(tensors, outputs))]
    requests = [_handle_map.pop(h) for h in handles]

    def finish(results):
        return [f(r) if f else r for r, (_, f) in zip(results, requests)]
    return _new_handle(_Group([r for r, _ in requests]), finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=None, compression=Compression.none):
    op = _op(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped(tensors, outputs, name, op, prescale_factor, postscale_factor, compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=None, compression=Compression.none):
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped(tensors, tensors, name, op, prescale_factor, postscale_factor, compression)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               compression=compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, compression=Compression.none):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                compression=compression))


# ---- allgather -------------------------------------------------------------------------------------------
def allgather_async(tensor, name=None, process_set=None):
    """Concatenates every rank's tensor along dim 0 (the first extent may differ per rank).
    Equal first extents run as one async request; unequal ones run at submission (shoal has no
    async allgatherv), and the handle is then already complete."""
    _check_tensor(tensor)
    name = _auto_name("allgather", name)
    tensor = tensor.contiguous()
    if tensor.dim() == 0:
        raise ValueError("allgather: tensor is a scalar; pass a tensor with at least one dimension")
    comm = _comm()
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
        return _new_handle(_Done(comm.allgatherv(tensor, rows)))
    except ShoalError as error:
        _raise(error)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.dim = tensor.shape[0]
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64))
        offset = int(dims[:rank()].sum()) if rank() else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None


def allgather(tensor, name=None, process_set=None):
    _check_tensor(tensor)
    return _Allgather.apply(tensor, name)


# ---- broadcast -------------------------------------------------------------------------------------------
def _broadcast_async(tensor, output, root_rank, name):
    _check_tensor(tensor)
    name = _auto_name("broadcast", name)
    try:
        return _new_handle(_comm().ibroadcast(tensor, name, root=root_rank, out=output))
    except ShoalError as error:
        _raise(error)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    return _broadcast_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format), root_rank, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    return _broadcast_async(tensor, tensor, root_rank, name)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average)
        if rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    _check_tensor(tensor)
    return _Broadcast.apply(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name))


# ---- reducescatter, alltoall -----------------------------------------------------------------------------
def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor over all ranks and gives rank r its share of dim 0 (the first
    dim % size ranks get one row more, as in Horovod). Runs at submission."""
    _check_tensor(tensor)
    op = _op(op)
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError("reducescatter: unsupported op %r" % (op,))
    comm = _comm()
    work = tensor.contiguous().clone()
    _scale(work, prescale_factor)
    if work.dim() == 0:
        raise ValueError("reducescatter: tensor is a scalar; pass a tensor with at least one dimension")
    rows = work.shape[0]
    try:
        if rows % comm.size == 0:
            out = comm.reduce_scatter(work, op=_OPS[op])
        else:  # uneven split: reduce everything, keep this rank's rows
            reduced = comm.allreduce(work, op=_OPS[op])
            base, extra = divmod(rows, comm.size)
            start = comm.rank * base + min(comm.rank, extra)
            out = reduced.narrow(0, start, base + (1 if comm.rank < extra else 0)).clone()
    except ShoalError as error:
        _raise(error)
    _scale(out, postscale_factor)
    return _new_handle(_Done(out))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.prescale_factor, ctx.postscale_factor = op, prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, None, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.clone()
        if ctx.op == Sum:
            grad_output *= size()
        grad_output *= ctx.prescale_factor * ctx.postscale_factor
        return allgather(grad_output), None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    _check_tensor(tensor)
    return _Reducescatter.apply(tensor, name, _op(op), prescale_factor, postscale_factor)


def _alltoall_now(tensor, splits):
    """(received rows, received splits as an int32 tensor), run at once (blocking C call)."""
    _check_tensor(tensor)
    if tensor.dim() == 0:
        raise ValueError("alltoall: tensor is a scalar; pass a tensor with at least one dimension")
    if splits is not None:
        splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    try:
        out, received = _comm().alltoall(tensor.contiguous(), splits)
    except ShoalError as error:
        _raise(error)
    return out, torch.tensor(received, dtype=torch.int32)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        out, received = _alltoall_now(tensor, splits)
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        # The gradient goes back the way the rows came: rank p's rows return to rank p.
        grad, _ = _alltoall_now(grad_output.contiguous(), ctx.received)
        return grad, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Horovod's alltoall: rank r sends splits[p] rows of tensor (dim 0, in order) to rank p and
    receives every rank's rows for it, concatenated in rank order. splits=None splits dim 0
    evenly. Returns the received tensor, and with splits also the received splits (an int32
    tensor, as Horovod >= 0.26)."""
    _check_tensor(tensor)
    out, received = _Alltoall.apply(tensor, splits, name)
    return out if splits is None else (out, received)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """As alltoall, but returns a handle for synchronize(). The async runtime has no alltoall
    request yet: the exchange runs at submission and the handle is already complete."""
    return _new_handle(_Done(alltoall(tensor, splits, name)))


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
        _comm().barrier()
    except ShoalError as error:
        _raise(error)


def join(device=-1):
    """Waits for every rank and returns the rank that arrived last (by each rank's wall clock at
    arrival). Unlike Horovod's join, ranks that joined do not stand in with zeros for other ranks'
    allreduces: every rank must run the same collectives."""
    arrival = torch.tensor([time.time()], dtype=torch.float64)
    try:
        times = _comm().allgather(arrival)
    except ShoalError as error:
        _raise(error)
    return int(torch.argmax(times))
