"""Low-rank helpers (include/shoal/lowrank.h): the PowerSGD plan, Pufferfish's
truncated SVD and rank rule. Arrays are numpy arrays or torch CPU tensors."""
import ctypes

import numpy as np

from . import _buffers as B
from . import _types as T
from ._comm import ShoalError, check, parse_op
from ._lib import lib

_PLAN_DTYPES = {"float32": T.F32, "float16": T.F16, "bfloat16": T.BF16}


def rank_for(rows, cols, rank_factor=4):
    """Pufferfish's rank for a [rows, cols] weight: max(1, min(rows, cols) // rank_factor)."""
    r = lib.shoal_lowrank_rank(int(rows), int(cols), int(rank_factor))
    if r == 0:
        raise ValueError("shoal.lowrank.rank_for: rows, cols and rank_factor must be >= 1, got %s, %s, %s"
                         % (rows, cols, rank_factor))
    return r


def factorize(w, rank):
    """Truncated SVD of a 2-D float32 matrix w [rows, cols]: returns (u, v, s) with
    u [rows, rank], v [cols, rank] (w ~= u @ v.T) and all singular values s, as numpy arrays."""
    src = B.describe(w, "w")
    if src.dtype != T.F32 or len(src.shape) != 2:
        raise TypeError("shoal.lowrank.factorize: w must be a 2-D float32 array, got %s of shape %s"
                        % (T.DTYPE_NAMES[src.dtype], src.shape))
    rows, cols = src.shape
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise TypeError("shoal.lowrank.factorize: rank must be an int, got %r" % (rank,))
    u = np.empty((rows, max(rank, 0)), dtype=np.float32)
    v = np.empty((cols, max(rank, 0)), dtype=np.float32)
    s = np.empty((max(min(rows, cols), 0),), dtype=np.float32)
    check(lib.shoal_lowrank_factorize(src.address, rows, cols, rank, u.ctypes.data, v.ctypes.data, s.ctypes.data))
    return u, v, s


class LowRankPlan:
    """A PowerSGD plan over a fixed list of matrices.

    matrices: a list of (rows, cols) or (rows, cols, name) or dicts with keys rows, cols,
    name, rank, dense. Every rank must build the same plan."""

    def __init__(self, matrices, rank=4, error_feedback=True, min_compression_rate=2.0, start_iter=0, seed=0,
                 dtype="float32"):
        if dtype not in _PLAN_DTYPES:
            raise ValueError("shoal.LowRankPlan: dtype must be one of %s, got %r" % (", ".join(_PLAN_DTYPES), dtype))
        specs = []
        for m in matrices:
            if isinstance(m, dict):
                specs.append((m["rows"], m["cols"], m.get("name"), m.get("rank", 0), m.get("dense", False)))
            else:
                m = tuple(m)
                specs.append((m[0], m[1], m[2] if len(m) > 2 else None, 0, False))
        if not specs:
            raise ValueError("shoal.LowRankPlan: matrices is empty")
        self._names = [None if n is None else str(n).encode() for _, _, n, _, _ in specs]
        array = (T.LowrankMatrix * len(specs))()
        for i, (rows, cols, _, r, dense) in enumerate(specs):
            array[i].rows, array[i].cols, array[i].rank = int(rows), int(cols), int(r)
            array[i].flags = T.LOWRANK_DENSE if dense else 0
            array[i].name = self._names[i]
        config = T.new(T.LowrankConfig, rank=int(rank), error_feedback=int(bool(error_feedback)),
                       min_compression_rate=float(min_compression_rate), start_iter=int(start_iter), seed=int(seed),
                       dtype=_PLAN_DTYPES[dtype], memory=T.MEMORY_HOST)
        handle = ctypes.c_void_p()
        check(lib.shoal_lowrank_plan_create(array, len(specs), ctypes.byref(config), ctypes.byref(handle)))
        self._handle = handle
        self.dtype = _PLAN_DTYPES[dtype]
        self.counts = [int(r) * int(c) for r, c, _, _, _ in specs]
        sizes = T.new(T.LowrankSizes)
        check(lib.shoal_lowrank_plan_sizes(handle, ctypes.byref(sizes)))
        self.sizes = {name: getattr(sizes, name) for name, _ in T.LowrankSizes._fields_ if name != "struct_size"}

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None:
            lib.shoal_lowrank_plan_destroy(handle)
            self._handle = None

    def _pointers(self, arrays, what, writable):
        arrays = list(arrays)
        if len(arrays) != len(self.counts):
            raise ValueError("shoal.LowRankPlan: %s has %d arrays, the plan %d matrices" % (what, len(arrays),
                                                                                          len(self.counts)))
        bufs = []
        for i, a in enumerate(arrays):
            b = B.describe(a, "%s[%d]" % (what, i), writable=writable)
            if b.dtype != self.dtype or b.count != self.counts[i]:
                raise ValueError("shoal.LowRankPlan: %s[%d] is %s with %d elements; the plan expects %s with %d"
                                 % (what, i, T.DTYPE_NAMES[b.dtype], b.count, T.DTYPE_NAMES[self.dtype],
                                    self.counts[i]))
            bufs.append(b)
        return bufs, (ctypes.c_void_p * len(bufs))(*[b.address for b in bufs])

    def step(self, comm, grads, outputs=None, op="avg"):
        """One PowerSGD step on comm (a shoal.Communicator); outputs None: in place."""
        keep, grad_ptrs = self._pointers(grads, "grads", outputs is None)
        out = grads if outputs is None else outputs
        keep2, out_ptrs = self._pointers(out, "outputs", True)
        status = lib.shoal_lowrank_step(self._handle, comm.handle, grad_ptrs, out_ptrs, parse_op(op))
        if status != 0:
            raise ShoalError(status, (lib.shoal_last_error(comm.handle) or b"").decode(errors="replace"))
        return out

    # The split phases, for callers that run the two SUM allreduces themselves.
    def phase_p(self, grads):
        """Returns (p_buf, p_count): allreduce-SUM p_buf[:p_count] on every rank."""
        self._grads = self._pointers(grads, "grads", False)
        self._p = np.zeros(max(self.sizes["p_elems"], 1), dtype=np.float32)
        count = ctypes.c_size_t(0)
        check(lib.shoal_lowrank_phase_p(self._handle, self._grads[1], self._p.ctypes.data, ctypes.byref(count)))
        return self._p, count.value

    def phase_q(self):
        """After p_buf was summed: returns (q_buf, q_count); allreduce-SUM q_buf[:q_count] (skip when 0)."""
        self._q = np.zeros(max(self.sizes["q_elems"], 1), dtype=np.float32)
        count = ctypes.c_size_t(0)
        check(lib.shoal_lowrank_phase_q(self._handle, self._p.ctypes.data, self._q.ctypes.data, ctypes.byref(count)))
        return self._q, count.value

    def finish(self, outputs, world_size, op="avg"):
        keep, out_ptrs = self._pointers(outputs, "outputs", True)
        check(lib.shoal_lowrank_finish(self._handle, self._p.ctypes.data, self._q.ctypes.data, out_ptrs,
                                       int(world_size), parse_op(op)))
        return outputs

    def state_save(self):
        size = ctypes.c_size_t(0)
        check(lib.shoal_lowrank_state_save(self._handle, None, ctypes.byref(size)))
        buffer = ctypes.create_string_buffer(size.value)
        check(lib.shoal_lowrank_state_save(self._handle, buffer, ctypes.byref(size)))
        return buffer.raw[:size.value]

    def state_load(self, state):
        data = bytes(state)
        check(lib.shoal_lowrank_state_load(self._handle, data, len(data)))
