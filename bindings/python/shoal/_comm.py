"""Communicator, Request and ShoalError: the framework-neutral core of the binding.

Every call into libshoal goes through ctypes.CDLL, which releases the GIL for
the duration of the call: a rank blocked in a collective or in Request.wait
lets other Python threads run (tests/python/test_core.py checks this).
"""
import ctypes
import os
import threading

import numpy as np

from . import _buffers as B
from . import _types as T
from ._lib import lib

_OP_ALIASES = {"sum": T.SUM, "avg": T.AVG, "average": T.AVG, "mean": T.AVG, "prod": T.PROD, "product": T.PROD,
               "min": T.MIN, "max": T.MAX, "band": T.BAND, "bor": T.BOR, "bxor": T.BXOR}


class ShoalError(RuntimeError):
    """A failed shoal call: `status` is the shoal_status_t code, `status_name` its
    name (e.g. SHOAL_ERR_REMOTE), `message` shoal's text saying what to fix."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = (lib.shoal_status_string(self.status) or b"").decode(errors="replace").split(":")[0]
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def _text(raw):
    return (raw or b"").decode(errors="replace")


def _place(buf):
    """Where a Buffer's memory lives, for error texts: "the host" or "CUDA device N"."""
    return "CUDA device %d" % buf.tensor.device if buf.tensor.memory == T.MEMORY_CUDA else "the host"


def check(status, comm_handle=None):
    if status != 0:
        raise ShoalError(status, _text(lib.shoal_last_error(comm_handle)))


def parse_op(op):
    if isinstance(op, str):
        code = _OP_ALIASES.get(op.lower())
        if code is None:
            raise ValueError("shoal: unknown op %r; use one of %s" % (op, ", ".join(sorted(_OP_ALIASES))))
        return code
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(T.OP_NAMES):
        return op
    raise TypeError("shoal: op must be a name such as 'sum' or 'avg' (or a shoal op code), got %r" % (op,))


def _cstr(value, what):
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError("shoal: %s must be a str, got %s" % (what, type(value).__name__))


def _options_string(options):
    """compressor options as the C library reads them: "k=v,..." from a str or a dict."""
    if options is None or isinstance(options, (str, bytes)):
        return options
    if isinstance(options, dict):
        return ",".join("%s=%s" % (k, int(v) if isinstance(v, bool) else v) for k, v in options.items())
    raise TypeError("shoal: compressor_options must be a 'k=v,...' string or a dict, got %s" % type(options).__name__)


def _timeout(timeout_s):
    if timeout_s is None:
        return 0.0
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool):
        raise TypeError("shoal: timeout_s must be a number of seconds, got %r" % (timeout_s,))
    return float(timeout_s)


# Requests in flight, so that their arrays stay alive even when the caller
# drops the Request object (Horovod's _handle_map does the same).
_in_flight = set()
_in_flight_lock = threading.Lock()


class Request:
    """An async collective in flight. wait() returns its result array."""

    def __init__(self, handle, keepalive, result, finish=None, name=None, collect=None):
        self._handle = handle
        self._keepalive = keepalive
        self._result = result
        self._finish = finish
        self._collect = collect  # reads a result the request holds (alltoall), before the handle is freed
        self.name = name
        self._done = False
        self._error = None
        with _in_flight_lock:
            _in_flight.add(self)

    def _complete(self, status):
        if self._done:
            return
        if status != 0:
            text = _text(lib.shoal_request_error(self._handle)) or _text(lib.shoal_last_error(None))
            self._error = ShoalError(status, text)
        elif self._collect is not None:
            try:
                self._result = self._collect(self._handle)
            except ShoalError as error:
                self._error = error
        lib.shoal_request_free(self._handle)
        self._handle = None
        self._done = True
        self._keepalive = None
        with _in_flight_lock:
            _in_flight.discard(self)
        if self._error is None and self._finish is not None:
            self._result = self._finish(self._result)

    def _outcome(self):
        if self._error is not None:
            raise self._error
        return self._result

    def test(self):
        """True once the request completed (then wait() returns at once); raises ShoalError if it failed."""
        if self._done:
            self._outcome()
            return True
        done = ctypes.c_int(0)
        status = lib.shoal_test(self._handle, ctypes.byref(done))
        if not done.value:
            check(status)  # a pending request reports OK; anything else is an argument error
            return False
        self._complete(status)
        self._outcome()
        return True

    def wait(self, timeout_s=None):
        """Waits up to timeout_s seconds (None: the communicator's SHOAL_TIMEOUT_S) and returns the result.
        On SHOAL_ERR_TIMEOUT the request stays pending and may be waited on again."""
        if not self._done:
            status = lib.shoal_wait(self._handle, _timeout(timeout_s))
            if status == -2:  # SHOAL_ERR_TIMEOUT: the request may still be pending, its arrays in use
                done = ctypes.c_int(0)
                tested = lib.shoal_test(self._handle, ctypes.byref(done))
                if not done.value:
                    raise ShoalError(status, "shoal_wait: request '%s' did not complete within %s s; it is still "
                                     "pending" % (self.name, "SHOAL_TIMEOUT_S" if timeout_s is None else timeout_s))
                status = tested
            self._complete(status)
        return self._outcome()

    @property
    def done(self):
        return self._done


def wait_all(requests, timeout_s=None):
    """Waits for every request within one deadline; returns their results in order.
    Raises the first failure (after every request has completed or the deadline passed)."""
    requests = list(requests)
    for r in requests:
        if not isinstance(r, Request):
            raise TypeError("shoal.wait_all: expected Request objects, got %s" % type(r).__name__)
    pending = [r for r in requests if not r._done]
    if pending:
        handles = (ctypes.c_void_p * len(pending))(*[r._handle for r in pending])
        status = lib.shoal_wait_all(handles, len(pending), _timeout(timeout_s))
        text = _text(lib.shoal_last_error(None))
        for r in pending:
            done = ctypes.c_int(0)
            st = lib.shoal_test(r._handle, ctypes.byref(done))
            if done.value:
                r._complete(st)
        if status != 0:
            failed = [r._error for r in requests if r._error is not None]
            # No request failed: the deadline passed with some still pending (they stay pending).
            raise failed[0] if failed else ShoalError(status, text)
    return [r._outcome() for r in requests]


class PreparedAllreduce:
    """An in-place named allreduce, described once (Communicator.prepare_iallreduce)."""
    __slots__ = ("comm", "name", "cname", "code", "buffer", "strings", "options", "tensor_ref", "options_ref",
                 "address", "shape", "dtype", "device", "stream")

    def __init__(self, comm, x, name, code, compressor, compressor_options, compress_min_bytes):
        self.comm = comm
        self.name = name
        self.cname = _cstr(name, "name")
        self.code = code
        self.buffer = B.describe(x, "x", writable=True, cuda=True)
        self.strings = [_cstr(compressor, "compressor"),
                        _cstr(_options_string(compressor_options), "compressor_options")]
        self.options = T.new(T.AsyncOptions, compressor=self.strings[0], compressor_options=self.strings[1],
                             compress_min_bytes=-1 if compress_min_bytes is None else int(compress_min_bytes))
        self.tensor_ref = ctypes.byref(self.buffer.tensor)
        self.options_ref = ctypes.byref(self.options)
        self.address = self.buffer.address or 0
        self.shape = self.buffer.shape
        self.dtype = getattr(x, "dtype", None)
        self.device = getattr(x, "device", None)
        self.stream = self.buffer.tensor.stream  # a CUDA tensor's: torch's current stream when prepared
        self.buffer.array = None  # the plan must not keep the tensor alive; each Request keeps its own

    def matches(self, x):
        """Whether x is the memory, dtype and shape this plan describes (a torch tensor or numpy array)."""
        if B.is_torch(x):
            device = x.device
            return (x.data_ptr() == self.address and x.dtype == self.dtype and tuple(x.shape) == self.shape
                    and x.is_contiguous() and device == self.device and not x.is_sparse
                    and (device.type == "cpu" or B.current_stream(x) == self.stream))
        if isinstance(x, np.ndarray):
            return (x.__array_interface__["data"][0] == self.address and x.dtype == self.dtype
                    and x.shape == self.shape and x.flags.c_contiguous and x.flags.writeable)
        return False


def _env_int(*names):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError("shoal: %s=%r is not an integer" % (name, value)) from None
    return None


class Communicator:
    """A shoal communicator (shoal_comm_t). Collective to create: every rank makes it.

    Fields left None are read from the environment (SHOAL_RANK, SHOAL_WORLD_SIZE,
    SHOAL_STORE, SHOAL_TOKEN, SHOAL_TIMEOUT_S, SHOAL_ALGO, or mpirun's/Slurm's variables)."""

    def __init__(self, rank=None, world_size=None, store=None, token=None, timeout_s=None, algorithm=None):
        for what, value in (("rank", rank), ("world_size", world_size)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError("shoal: %s must be an int, got %r" % (what, value))
        config = T.new(T.Config)
        config.rank = -1 if rank is None else rank
        config.world_size = -1 if world_size is None else world_size
        self._strings = [_cstr(store, "store"), _cstr(token, "token"), _cstr(algorithm, "algorithm")]
        config.store, config.token, config.algorithm = self._strings
        config.timeout_s = -1.0 if timeout_s is None else _timeout(timeout_s)
        handle = ctypes.c_void_p()
        check(lib.shoal_comm_init_config(ctypes.byref(config), ctypes.byref(handle)))
        self._handle = handle
        value = ctypes.c_int()
        check(lib.shoal_comm_rank(handle, ctypes.byref(value)), handle)
        self.rank = value.value
        check(lib.shoal_comm_size(handle, ctypes.byref(value)), handle)
        self.size = value.value
        local_rank = _env_int("SHOAL_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")
        local_size = _env_int("SHOAL_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")
        # No launcher variable: every rank is taken to be on this machine.
        self.local_rank = self.rank if local_rank is None else local_rank
        self.local_size = self.size if local_size is None else local_size

    # ---- sub-communicators (docs/groups.md) --------------------------------
    @classmethod
    def _adopt(cls, handle, parent):
        """A Communicator around a handle that shoal_comm_split/create_group made."""
        comm = cls.__new__(cls)
        comm._strings = parent._strings
        comm._handle = handle
        value = ctypes.c_int()
        check(lib.shoal_comm_rank(handle, ctypes.byref(value)), handle)
        comm.rank = value.value
        check(lib.shoal_comm_size(handle, ctypes.byref(value)), handle)
        comm.size = value.value
        # The launcher's local rank and size describe the job, not the group.
        comm.local_rank, comm.local_size = comm.rank, comm.size
        return comm

    def split(self, color, key=0):
        """Collective over every rank of this communicator (MPI_Comm_split): ranks passing the
        same color >= 0 form a new Communicator, ranked by (key, rank here). color None (or
        SPLIT_UNDEFINED, -1) leaves this rank out: it gets None."""
        for what, value in (("color", color), ("key", key)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError("shoal: split %s must be an int, got %r" % (what, value))
        handle = ctypes.c_void_p()
        check(lib.shoal_comm_split(self.handle, -1 if color is None else color, key or 0, ctypes.byref(handle)),
              self.handle)
        return Communicator._adopt(handle, self) if handle.value else None

    def create_group(self, ranks):
        """Collective over every rank of this communicator (torch's new_group): the listed ranks
        form a new Communicator, ranked in list order; the others get None. Every rank must pass
        the same list (else ShoalError SHOAL_ERR_MISMATCH on every rank)."""
        ranks = list(ranks)
        for r in ranks:
            if not isinstance(r, int) or isinstance(r, bool):
                raise TypeError("shoal: create_group ranks must be ints, got %r" % (r,))
        array = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        handle = ctypes.c_void_p()
        check(lib.shoal_comm_create_group(self.handle, array, len(ranks), ctypes.byref(handle)), self.handle)
        return Communicator._adopt(handle, self) if handle.value else None

    # ---- life cycle -------------------------------------------------------
    @property
    def handle(self):
        if self._handle is None:
            raise ShoalError(-1, "the communicator was finalized; create a new one (shoal.init())")
        return self._handle

    def finalize(self):
        """Stops the runtime and releases the transport (local); later calls raise ShoalError."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            lib.shoal_comm_destroy(handle)

    close = finalize

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()

    def __del__(self):
        try:
            self.finalize()
        except Exception:
            pass

    def _check(self, status):
        if status != 0:
            raise ShoalError(status, _text(lib.shoal_last_error(self._handle)))

    # ---- helpers ------------------------------------------------------------
    @staticmethod
    def _output(src, out, shape, what="out"):
        """out described as writable, or a fresh array of src's kind with the given shape. A CUDA
        src (the async calls) needs out on the same device: a fresh one is made there."""
        array = B.empty_like(src, shape) if out is None else out
        cuda = src.tensor.memory == T.MEMORY_CUDA
        buf = B.describe(array, what, writable=True, cuda=cuda)
        if buf.tensor.memory != src.tensor.memory or (cuda and buf.tensor.device != src.tensor.device):
            raise TypeError("shoal: %s is on %s but the input on %s; pass both on the same device"
                            % (what, _place(buf), _place(src)))
        if buf.dtype != src.dtype:
            raise TypeError("shoal: %s has dtype %s but the input has %s" % (what, T.DTYPE_NAMES[buf.dtype],
                                                                            T.DTYPE_NAMES[src.dtype]))
        expected = 1
        for d in shape:
            expected *= d
        if buf.count != expected:
            raise ValueError("shoal: %s holds %d elements but the result needs %d (shape %s)"
                             % (what, buf.count, expected, tuple(shape)))
        return array, buf

    @staticmethod
    def _same_memory(a, b):
        return a.address == b.address and a.nbytes == b.nbytes

    # ---- blocking collectives -------------------------------------------------
    def allreduce(self, x, out=None, op="sum", name=None, compressor=None, compressor_options=None,
                  compress_min_bytes=None):
        """Reduces x over all ranks into out (a fresh array when None; out=x: in place). Returns out.
        compressor/compressor_options/compress_min_bytes: per call (None: SHOAL_COMPRESSOR etc.);
        name keys the compressor's state (error feedback) and is required by stateful ones."""
        code = parse_op(op)
        src = B.describe(x, "x", writable=out is not None and out is x, cuda=True)
        array, dst = self._output(src, out, src.shape)
        dst.tensor.ndim = src.tensor.ndim
        ctypes.memmove(ctypes.addressof(dst.tensor.shape), ctypes.addressof(src.tensor.shape), 8 * T.MAX_DIMS)
        strings = [_cstr(name, "name"), _cstr(compressor, "compressor"),
                   _cstr(_options_string(compressor_options), "compressor_options")]
        options = T.new(T.AllreduceOptions, name=strings[0], compressor=strings[1], compressor_options=strings[2],
                        compress_min_bytes=-1 if compress_min_bytes is None else int(compress_min_bytes))
        self._check(lib.shoal_allreduce_tensor(self.handle, ctypes.byref(src.tensor), ctypes.byref(dst.tensor),
                                               code, ctypes.byref(options)))
        return array

    def _gather_shape(self, src):
        return (self.size * src.shape[0],) + src.shape[1:] if src.shape else (self.size,)

    def allgather(self, x, out=None):
        """Concatenates every rank's x along the first axis (same shape on every rank). Returns out."""
        src = B.describe(x, "x")
        array, dst = self._output(src, out, self._gather_shape(src))
        self._check(lib.shoal_allgather(self.handle, src.address, dst.address, src.count, src.dtype))
        return array

    def allgatherv(self, x, counts=None):
        """Concatenates every rank's x along the first axis; the first extent may differ per rank
        (the trailing ones may not). counts: every rank's first extent, or None to exchange them."""
        src = B.describe(x, "x")
        if not src.shape:
            raise ValueError("shoal.allgatherv: x is a scalar; pass an array with a first axis")
        rows = src.shape[0]
        row_elems = 1
        for d in src.shape[1:]:
            row_elems *= d
        if counts is None:
            import numpy as np
            trailing = list(src.shape[1:]) + [-1] * (T.MAX_DIMS - len(src.shape))
            mine = np.array([rows] + trailing, dtype=np.int64)
            every = self.allgather(mine).reshape(self.size, -1)
            if (every[:, 1:] != every[0, 1:]).any():
                raise ShoalError(-4, "shoal.allgatherv: ranks passed arrays whose trailing shapes differ (rank: "
                                 "trailing extents, -1 = none): %s; only the first extent may differ"
                                 % {r: [int(v) for v in every[r, 1:] if v >= 0] for r in range(self.size)})
            counts = [int(c) for c in every[:, 0]]
        counts = list(counts)
        if len(counts) != self.size or counts[self.rank] != rows:
            raise ValueError("shoal.allgatherv: counts must list every rank's first extent (%d ranks; this rank's "
                             "x has %d rows), got %s" % (self.size, rows, counts))
        array, dst = self._output(src, None, (sum(counts),) + src.shape[1:])
        recvcounts = (ctypes.c_size_t * self.size)(*[c * row_elems for c in counts])
        self._check(lib.shoal_allgatherv(self.handle, src.address, src.count, dst.address, recvcounts, None,
                                         src.dtype))
        return array

    def alltoall(self, x, splits=None):
        """Rank r sends rows splits[p] of x (in order along the first axis) to rank p and returns
        (the rows received from every rank, concatenated in rank order; the list of their counts).
        splits=None splits x evenly (its first extent must be a multiple of the world size).
        A torch CUDA tensor (a CUDA build) travels over NCCL; the result is made on its device."""
        import numpy as np
        src = B.describe(x, "x", cuda=True)
        if not src.shape:
            raise ValueError("shoal.alltoall: x is a scalar; pass an array with a first axis")
        rows, row_elems = src.shape[0], 1
        for d in src.shape[1:]:
            row_elems *= d
        if splits is None:
            if rows % self.size:
                raise ValueError("shoal.alltoall: x has %d rows, not a multiple of the world size %d; pass splits"
                                 % (rows, self.size))
            array, dst = self._output(src, None, src.shape)
            self._check(lib.shoal_alltoall_tensor(self.handle, ctypes.byref(src.tensor), ctypes.byref(dst.tensor)))
            return array, [rows // self.size] * self.size
        splits = [int(s) for s in splits]
        if len(splits) != self.size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError("shoal.alltoall: splits must hold %d counts >= 0 that add up to x's %d rows, got %s"
                             % (self.size, rows, splits))
        # Every peer's row count first (one int64 each way, host memory whatever x's), then the rows:
        # the output is made at its size on x's device (torch) and the tensor call fills it.
        mine, theirs = np.array(splits, dtype=np.int64), np.zeros(self.size, dtype=np.int64)
        self._check(lib.shoal_alltoall(self.handle, mine.ctypes.data, theirs.ctypes.data, 1, T.I64))
        received = [int(v) for v in theirs]
        array, dst = self._output(src, None, (sum(received),) + tuple(src.shape[1:]))
        sendcounts = (ctypes.c_size_t * self.size)(*[s * row_elems for s in splits])
        recvcounts = (ctypes.c_size_t * self.size)(*[r * row_elems for r in received])
        self._check(lib.shoal_alltoallv_tensor(self.handle, ctypes.byref(src.tensor), sendcounts, None,
                                               ctypes.byref(dst.tensor), recvcounts, None))
        return array, received

    def broadcast(self, x, root=0, out=None):
        """Root's x into out on every rank (a fresh array when None; out=x: in place). Returns out."""
        self._check_root(root)
        src = B.describe(x, "x", writable=out is not None and out is x)
        array, dst = self._output(src, out, src.shape)
        self._check(lib.shoal_broadcast(self.handle, src.address, dst.address, src.count, src.dtype, root))
        return array

    def reduce_scatter(self, x, op="sum", out=None):
        """x holds size blocks; rank r gets the reduction of block r (shape: x's first axis / size).
        A torch CUDA tensor (a CUDA build) takes ncclReduceScatter (not the bitwise ops)."""
        code = parse_op(op)
        src = B.describe(x, "x", cuda=True)
        if src.count % self.size:
            raise ValueError("shoal.reduce_scatter: x holds %d elements, not a multiple of the %d ranks"
                             % (src.count, self.size))
        if src.shape and src.shape[0] % self.size == 0:
            shape = (src.shape[0] // self.size,) + src.shape[1:]
        else:
            shape = (src.count // self.size,)
        array, dst = self._output(src, out, shape)
        self._check(lib.shoal_reduce_scatter_tensor(self.handle, ctypes.byref(src.tensor), ctypes.byref(dst.tensor),
                                                    code))
        return array

    def barrier(self):
        self._check(lib.shoal_barrier(self.handle))

    def join(self, timeout_s=None):
        """Horovod's join: until every rank joined, this rank stands in with zeros for the others' named
        allreduces. Returns the rank that joined last. timeout_s None: SHOAL_TIMEOUT_S; after a timeout
        this rank stays joined and join() again keeps waiting."""
        last = ctypes.c_int(-1)
        self._check(lib.shoal_join(self.handle, _timeout(timeout_s), ctypes.byref(last)))
        return last.value

    def fused_allreduce(self, tensors, op="avg"):
        """In place: every tensor reduced in ONE uncompressed collective (Pufferfish's factor gradients)."""
        code = parse_op(op)
        bufs = [B.describe(t, "tensors[%d]" % i, writable=True) for i, t in enumerate(tensors)]
        if not bufs:
            raise ValueError("shoal.fused_allreduce: tensors is empty")
        array = (T.Tensor * len(bufs))(*[b.tensor for b in bufs])
        self._check(lib.shoal_fused_allreduce(self.handle, array, len(bufs), code))
        return tensors

    def _check_root(self, root):
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < self.size:
            raise ValueError("shoal: root %r is not a rank of this communicator (0..%d)" % (root, self.size - 1))

    # ---- async ------------------------------------------------------------------
    def iallreduce(self, x, name, out=None, op="sum", compressor=None, compressor_options=None,
                   compress_min_bytes=None, finish=None):
        """Submits a named allreduce to the runtime; returns a Request whose wait() gives out."""
        code = parse_op(op)
        cname = _cstr(name, "name")
        src = B.describe(x, "x", writable=out is not None and out is x, cuda=True)
        array, dst = self._output(src, out, src.shape)
        dst.tensor.ndim = src.tensor.ndim
        ctypes.memmove(ctypes.addressof(dst.tensor.shape), ctypes.addressof(src.tensor.shape), 8 * T.MAX_DIMS)
        strings = [_cstr(compressor, "compressor"), _cstr(_options_string(compressor_options), "compressor_options")]
        options = T.new(T.AsyncOptions, compressor=strings[0], compressor_options=strings[1],
                        compress_min_bytes=-1 if compress_min_bytes is None else int(compress_min_bytes))
        handle = ctypes.c_void_p()
        self._check(lib.shoal_iallreduce(self.handle, cname, ctypes.byref(src.tensor), ctypes.byref(dst.tensor),
                                         code, ctypes.byref(options), ctypes.byref(handle)))
        return Request(handle, (src, dst, strings, cname), array, finish, name)

    def prepare_iallreduce(self, x, name, op="sum", compressor=None, compressor_options=None,
                           compress_min_bytes=None):
        """Describes an in-place named allreduce of x once, for submit_prepared() to submit many times.

        A training step allreduces the same gradient buffers under the same names every step:
        describing the tensor, encoding the name and the options again each time is most of the
        binding's cost per submission. The plan holds x's address, dtype and shape as they are
        now; matches() says whether a tensor still fits it (same memory, dtype and shape)."""
        return PreparedAllreduce(self, x, name, parse_op(op), compressor, compressor_options, compress_min_bytes)

    def submit_prepared(self, plan, tensor):
        """Submits plan's allreduce of tensor (in place; tensor must match the plan); returns a Request."""
        if plan.comm is not self or not plan.matches(tensor):
            raise ValueError("shoal: submit_prepared: the tensor no longer matches the plan for '%s' (its memory, "
                             "dtype or shape changed, or the plan is another communicator's): prepare it again"
                             % plan.name)
        return self._submit_matched(plan, tensor)

    def _submit_matched(self, plan, tensor):
        """submit_prepared for a caller that has just checked plan.matches(tensor) itself
        (DistributedOptimizer's hooks, once a step per gradient)."""
        handle = ctypes.c_void_p()
        self._check(lib.shoal_iallreduce(self.handle, plan.cname, plan.tensor_ref, plan.tensor_ref, plan.code,
                                         plan.options_ref, ctypes.byref(handle)))
        return Request(handle, (plan, tensor), tensor, None, plan.name)

    def iallgather(self, x, name, out=None):
        cname = _cstr(name, "name")
        src = B.describe(x, "x", cuda=True)
        array, dst = self._output(src, out, self._gather_shape(src))
        handle = ctypes.c_void_p()
        self._check(lib.shoal_iallgather(self.handle, cname, ctypes.byref(src.tensor), dst.address,
                                         ctypes.byref(handle)))
        return Request(handle, (src, dst, cname), array, None, name)

    def ibroadcast(self, x, name, root=0, out=None):
        """Root's x into out (None: a fresh array; out=x: in place)."""
        self._check_root(root)
        cname = _cstr(name, "name")
        src = B.describe(x, "x", writable=out is not None and out is x, cuda=True)
        array, dst = self._output(src, out, src.shape)
        if not self._same_memory(src, dst):
            B.copy_into(dst, src)
        dst.tensor.ndim = src.tensor.ndim
        ctypes.memmove(ctypes.addressof(dst.tensor.shape), ctypes.addressof(src.tensor.shape), 8 * T.MAX_DIMS)
        handle = ctypes.c_void_p()
        self._check(lib.shoal_ibroadcast(self.handle, cname, ctypes.byref(dst.tensor), root, ctypes.byref(handle)))
        return Request(handle, (src, dst, cname), array, None, name)

    def ireduce_scatter(self, x, name, op="sum", out=None):
        """Submits a named reduce-scatter (shoal_ireduce_scatter) to the runtime; returns a Request
        whose wait() gives out: this rank's share of the reduction's first axis, rows // size rows
        (one more on the first rows % size ranks), a fresh array when out is None. A torch CUDA
        tensor (a CUDA build): out is on x's device, written by NCCL on x's stream."""
        code = parse_op(op)
        cname = _cstr(name, "name")
        src = B.describe(x, "x", cuda=True)
        if not src.shape:
            raise ValueError("shoal.ireduce_scatter: x is a scalar; pass an array with a first axis")
        if len(src.shape) > T.MAX_DIMS:
            raise ValueError("shoal.ireduce_scatter: x has %d dimensions, more than %d; reshape it"
                             % (len(src.shape), T.MAX_DIMS))
        rows, size, rank = src.shape[0], self.size, self.rank
        share = rows // size + (1 if rank < rows % size else 0)
        array, dst = self._output(src, out, (share,) + tuple(src.shape[1:]))
        handle = ctypes.c_void_p()
        self._check(lib.shoal_ireduce_scatter(self.handle, cname, ctypes.byref(src.tensor), ctypes.byref(dst.tensor),
                                              code, ctypes.byref(handle)))
        return Request(handle, (src, dst, cname), array, None, name)

    def ialltoall(self, x, name, splits=None):
        """Submits a named alltoall (rows of x's first axis, as alltoall()) to the runtime; returns a
        Request whose wait() gives (the received rows, the list of their counts per rank). A torch
        CUDA tensor (a CUDA build): the rows arrive in device memory the request holds, and are
        copied into a torch tensor on x's device (shoal_request_alltoall_copy) before it is freed."""
        cname = _cstr(name, "name")
        src = B.describe(x, "x", cuda=True)
        if not src.shape:
            raise ValueError("shoal.ialltoall: x is a scalar; pass an array with a first axis")
        rows, row_shape, row_elems = src.shape[0], tuple(src.shape[1:]), 1
        for d in row_shape:
            row_elems *= d
        if row_elems == 0:
            raise ValueError("shoal.ialltoall: x's rows hold no elements (shape %s); use alltoall()" % (src.shape,))
        sendcounts = None
        if splits is None:
            if rows % self.size:
                raise ValueError("shoal.ialltoall: x has %d rows, not a multiple of the world size %d; pass splits"
                                 % (rows, self.size))
        else:
            splits = [int(s) for s in splits]
            if len(splits) != self.size or any(s < 0 for s in splits) or sum(splits) != rows:
                raise ValueError("shoal.ialltoall: splits must hold %d counts >= 0 that add up to x's %d rows, got %s"
                                 % (self.size, rows, splits))
            sendcounts = (ctypes.c_size_t * self.size)(*[s * row_elems for s in splits])
        handle = ctypes.c_void_p()
        self._check(lib.shoal_ialltoall(self.handle, cname, ctypes.byref(src.tensor), sendcounts,
                                        ctypes.byref(handle)))
        size = self.size

        def collect(request):
            # The library copies (host or device memory alike), so the binding needs no CUDA of its own.
            data, count = ctypes.c_void_p(), ctypes.c_size_t(0)
            counts = (ctypes.c_size_t * size)()
            check(lib.shoal_request_alltoall_result(request, ctypes.byref(data), ctypes.byref(count), counts))
            array, dst = self._output(src, None, (count.value // row_elems,) + row_shape)
            if dst.tensor.memory == T.MEMORY_CUDA and dst.tensor.stream != src.tensor.stream:
                # torch may hand out memory whose last use is still queued on the current stream;
                # the copy runs on the request's (the input's) stream: let the former finish first.
                B._torch().cuda.current_stream(array.device).synchronize()
            check(lib.shoal_request_alltoall_copy(request, dst.address, dst.nbytes))
            return array, [c // row_elems for c in counts]
        return Request(handle, (src, cname, sendcounts), None, None, name, collect)

    def async_start(self):
        self._check(lib.shoal_async_start(self.handle))

    # ---- statistics and state ------------------------------------------------------
    def last_compress_stats(self):
        """What the last compressed call did: compressor, input/payload/wire bytes, rounds."""
        stats = T.new(T.CompressStats)
        self._check(lib.shoal_last_compress_stats(self.handle, ctypes.byref(stats)))
        return {"compressor": _text(stats.compressor), "input_bytes": stats.input_bytes,
                "payload_bytes": stats.payload_bytes, "wire_bytes": stats.wire_bytes, "rounds": stats.rounds}

    def async_stats(self):
        stats = T.new(T.AsyncStats)
        self._check(lib.shoal_async_stats(self.handle, ctypes.byref(stats)))
        return {name: getattr(stats, name) for name, _ in T.AsyncStats._fields_ if name != "struct_size"}

    def compressor_state_save(self, compressor, name, compressor_options=None):
        """A named tensor's compressor state as bytes (None when the compressor holds none)."""
        args = [_cstr(compressor, "compressor"), _cstr(_options_string(compressor_options), "compressor_options"),
                _cstr(name, "name")]
        size = ctypes.c_size_t(0)
        status = lib.shoal_compressor_state_save(self.handle, *args, None, ctypes.byref(size))
        if status == -6:  # SHOAL_ERR_NOT_FOUND: no state for that name
            return None
        self._check(status)
        buffer = ctypes.create_string_buffer(size.value)
        self._check(lib.shoal_compressor_state_save(self.handle, *args, buffer, ctypes.byref(size)))
        return buffer.raw[:size.value]

    def compressor_state_load(self, compressor, name, state, compressor_options=None):
        data = bytes(state)
        self._check(lib.shoal_compressor_state_load(
            self.handle, _cstr(compressor, "compressor"), _cstr(_options_string(compressor_options),
                                                                "compressor_options"),
            _cstr(name, "name"), data, len(data)))
