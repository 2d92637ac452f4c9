"""Turns Python arrays into shoal_tensor_t descriptors without copying.

torch tensors are read through data_ptr() (never tensor.numpy(): that ties the
binding to torch's NumPy ABI). Everything else goes through numpy: objects with
__array_interface__ or the buffer protocol by np.asarray, other __dlpack__
producers (JAX, CuPy on the host, ...) by np.from_dlpack, which gives a view
that is often read-only. A read-only array can be an input, never an output;
the collectives then write a fresh array.
"""
import ctypes
import sys

import numpy as np

from . import _types as T

_NUMPY_DTYPES = {
    "float16": T.F16, "bfloat16": T.BF16, "float32": T.F32, "float64": T.F64, "int8": T.I8, "uint8": T.U8,
    "int32": T.I32, "uint32": T.U32, "int64": T.I64, "uint64": T.U64,
}


def torch_dtypes(torch):
    """torch dtype -> shoal dtype code, for the dtypes both have."""
    table = {torch.float16: T.F16, torch.bfloat16: T.BF16, torch.float32: T.F32, torch.float64: T.F64,
             torch.int8: T.I8, torch.uint8: T.U8, torch.int32: T.I32, torch.int64: T.I64}
    for name, code in (("uint32", T.U32), ("uint64", T.U64)):  # torch >= 2.3
        if hasattr(torch, name):
            table[getattr(torch, name)] = code
    return table


_torch_table = None


def _torch():
    """torch if the program imported it (the binding never imports it itself)."""
    return sys.modules.get("torch")


def is_torch(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


class Buffer:
    """A shoal_tensor_t view of an array plus the array it points into.

    `array` must stay alive while shoal may touch the memory: for async
    requests the Request keeps the Buffer.
    """
    __slots__ = ("array", "tensor", "dtype", "count", "shape", "writable", "is_torch")

    def __init__(self, array, address, dtype, shape, writable, torch_array):
        self.array = array
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.count = 1
        for d in self.shape:
            self.count *= d
        self.writable = writable
        self.is_torch = torch_array
        self.tensor = T.Tensor()
        self.tensor.data = address or None
        self.tensor.dtype = dtype
        described = self.shape if len(self.shape) <= T.MAX_DIMS else (self.count,)
        self.tensor.ndim = len(described)
        for i, d in enumerate(described):
            self.tensor.shape[i] = d
        self.tensor.memory = T.MEMORY_HOST

    @property
    def nbytes(self):
        return self.count * T.DTYPE_SIZES[self.dtype]

    @property
    def address(self):
        return self.tensor.data


def _from_torch(obj, what, writable, cuda=False):
    global _torch_table
    torch = _torch()
    if _torch_table is None:
        _torch_table = torch_dtypes(torch)
    if obj.device.type != "cpu" and not (cuda and obj.device.type == "cuda"):
        raise TypeError("shoal: %s is a %s tensor; this binding takes CPU tensors (move it with .cpu())"
                        % (what, obj.device.type))
    if obj.is_sparse:
        raise TypeError("shoal: %s is a sparse tensor; pass a dense one (.to_dense())" % what)
    dtype = _torch_table.get(obj.dtype)
    if dtype is None:
        raise TypeError("shoal: %s has dtype %s, which shoal does not have; shoal takes %s"
                        % (what, obj.dtype, ", ".join(str(d) for d in _torch_table)))
    if not obj.is_contiguous():
        if writable:
            raise ValueError("shoal: %s is not contiguous; shoal writes it in place, so pass a contiguous tensor "
                             "(.contiguous())" % what)
        obj = obj.contiguous()
    buf = Buffer(obj, obj.data_ptr(), dtype, obj.shape, True, True)
    if obj.device.type == "cuda":
        # Device memory, ordered on the stream torch queues this device's work on now
        # (docs/gpu.md, "Async requests on CUDA tensors").
        buf.tensor.memory = T.MEMORY_CUDA
        buf.tensor.device = obj.device.index if obj.device.index is not None else torch.cuda.current_device()
        buf.tensor.stream = current_stream(obj)
    return buf


def current_stream(obj):
    """The cudaStream_t (an int; None for the default stream) torch queues obj's device's work on now."""
    return _torch().cuda.current_stream(obj.device).cuda_stream or None


def _to_numpy(obj, what):
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        return np.asarray(obj)
    if hasattr(obj, "__dlpack__"):
        return np.from_dlpack(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError("shoal: %s is a %s, not an array: pass a numpy array, a torch CPU tensor, or any object "
                        "with the buffer protocol, __array_interface__ or __dlpack__" % (what, type(obj).__name__)) \
            from None
    return np.asarray(view)


def describe(obj, what="the tensor", writable=False, cuda=False):
    """A Buffer over obj. writable=True: shoal will write into it (an output or in-place tensor).
    cuda=True: a torch CUDA tensor is taken too (the calls whose C form takes CUDA tensors); else
    only host memory."""
    if is_torch(obj):
        return _from_torch(obj, what, writable, cuda)
    array = _to_numpy(obj, what)
    dtype = _NUMPY_DTYPES.get(array.dtype.name)
    if dtype is None:
        raise TypeError("shoal: %s has dtype %s, which shoal does not have; shoal takes %s"
                        % (what, array.dtype, ", ".join(_NUMPY_DTYPES)))
    if writable and not array.flags.writeable:
        raise ValueError("shoal: %s is read-only and cannot be an output; leave out= unset to get a fresh array"
                         % what)
    if not array.flags.c_contiguous:
        if writable:
            raise ValueError("shoal: %s is not C-contiguous; shoal writes it in place, so pass a contiguous array "
                             "(np.ascontiguousarray)" % what)
        array = np.ascontiguousarray(array)
    return Buffer(array, array.__array_interface__["data"][0], dtype, array.shape, array.flags.writeable, False)


def empty_like(buf, shape=None):
    """A fresh, writable array of buf's kind (torch or numpy) and dtype."""
    shape = buf.shape if shape is None else tuple(shape)
    if buf.is_torch:
        torch = _torch()
        return torch.empty(shape, dtype=buf.array.dtype, device=buf.array.device)
    return np.empty(shape, dtype=buf.array.dtype)


def copy_into(dst, src):
    """Copies src's bytes into dst (same byte count; both host memory, or both torch CUDA tensors:
    then torch copies on the current stream, the one the collective is ordered on)."""
    if dst.nbytes != src.nbytes:
        raise ValueError("shoal: internal size mismatch in copy (%d vs %d bytes)" % (dst.nbytes, src.nbytes))
    if dst.tensor.memory == T.MEMORY_CUDA or src.tensor.memory == T.MEMORY_CUDA:
        if dst.tensor.memory != src.tensor.memory:
            raise TypeError("shoal: the output is %s memory but the input %s; pass both on the same device"
                            % ("CUDA" if dst.tensor.memory == T.MEMORY_CUDA else "host",
                               "CUDA" if src.tensor.memory == T.MEMORY_CUDA else "host"))
        dst.array.reshape(-1).copy_(src.array.reshape(-1))
        return
    if dst.nbytes:
        ctypes.memmove(dst.address, src.address, dst.nbytes)
