"""shoal: collective communication with compressors inside the collective.

A thin ctypes binding over libshoal's C API (include/shoal/shoal.h): no compiled
extension, so one package serves every CPython 3 and every framework release.

    import shoal
    shoal.init()                          # rank, size, store from the launcher (shoalrun, mpirun, srun)
    y = shoal.allreduce(x, op="avg")      # numpy arrays, torch CPU tensors, anything with __dlpack__
    r = shoal.iallreduce(g, name="layer1.weight", compressor="powersgd", compressor_options="rank=2")
    r.wait()

Module-level functions work on the communicator shoal.init() made; shoal.Communicator
makes more (e.g. several ranks as threads of one process over a memory:// store).
Every error raises shoal.ShoalError (status code + shoal's text). libshoal is called
through ctypes.CDLL, which releases the GIL for every call.
"""
import atexit
import ctypes
import os
import tempfile

from ._comm import Communicator, Request, ShoalError, wait_all
from ._lib import lib, path as library_path, version_code
from . import lowrank  # noqa: F401  (shoal.lowrank)
from .lowrank import LowRankPlan, factorize, rank_for

__version__ = "%d.%d.%d" % (version_code // 10000, version_code // 100 % 100, version_code % 100)

__all__ = [
    "Communicator", "Request", "ShoalError", "LowRankPlan", "init", "finalize", "is_initialized", "communicator",
    "rank", "size", "local_rank", "local_size", "allreduce", "allgather", "allgatherv", "broadcast",
    "reduce_scatter", "barrier", "join", "iallreduce", "iallgather", "ibroadcast", "wait_all", "fused_allreduce",
    "last_compress_stats", "async_stats", "compressors", "config_text", "factorize", "rank_for", "library_path",
    "version_code", "__version__",
]

_default = None


def init(rank=None, world_size=None, store=None, token=None, timeout_s=None, algorithm=None):
    """Creates the default communicator (collective). Arguments left None come from the environment."""
    global _default
    if _default is not None:
        return _default
    _default = Communicator(rank=rank, world_size=world_size, store=store, token=token, timeout_s=timeout_s,
                            algorithm=algorithm)
    return _default


def finalize():
    """Finalizes the default communicator (requests still pending anywhere fail). Idempotent."""
    global _default
    if _default is not None:
        comm, _default = _default, None
        comm.finalize()


atexit.register(finalize)


def is_initialized():
    return _default is not None


def communicator():
    """The default communicator; ShoalError when shoal.init() was not called."""
    if _default is None:
        raise ShoalError(-1, "shoal has not been initialized; call shoal.init() first")
    return _default


def rank():
    return communicator().rank


def size():
    return communicator().size


def local_rank():
    return communicator().local_rank


def local_size():
    return communicator().local_size


def allreduce(x, out=None, op="sum", name=None, compressor=None, compressor_options=None, compress_min_bytes=None):
    return communicator().allreduce(x, out, op, name, compressor, compressor_options, compress_min_bytes)


def allgather(x, out=None):
    return communicator().allgather(x, out)


def allgatherv(x, counts=None):
    return communicator().allgatherv(x, counts)


def broadcast(x, root=0, out=None):
    return communicator().broadcast(x, root, out)


def reduce_scatter(x, op="sum", out=None):
    return communicator().reduce_scatter(x, op, out)


def barrier():
    communicator().barrier()


def join(timeout_s=None):
    return communicator().join(timeout_s)


def fused_allreduce(tensors, op="avg"):
    return communicator().fused_allreduce(tensors, op)


def iallreduce(x, name, out=None, op="sum", compressor=None, compressor_options=None, compress_min_bytes=None):
    return communicator().iallreduce(x, name, out, op, compressor, compressor_options, compress_min_bytes)


def iallgather(x, name, out=None):
    return communicator().iallgather(x, name, out)


def ibroadcast(x, name, root=0, out=None):
    return communicator().ibroadcast(x, name, root, out)


def last_compress_stats():
    return communicator().last_compress_stats()


def async_stats():
    return communicator().async_stats()


_libc = ctypes.CDLL(None)
_libc.fdopen.restype = ctypes.c_void_p
_libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
_libc.fclose.argtypes = [ctypes.c_void_p]


def _capture(call):
    """Runs call(FILE*) and returns what it wrote (the C API prints to a FILE*)."""
    with tempfile.TemporaryFile() as f:
        stream = _libc.fdopen(os.dup(f.fileno()), b"w")
        try:
            status = call(stream)
        finally:
            _libc.fclose(stream)
        f.seek(0)
        text = f.read().decode(errors="replace")
    if status != 0:
        raise ShoalError(status, (lib.shoal_last_error(None) or b"").decode(errors="replace"))
    return text


def compressors():
    """The available compressors (built-ins and plugins on SHOAL_PLUGIN_PATH), one per line with its options."""
    return _capture(lib.shoal_compressors_print)


def config_text(markdown=False):
    """Every SHOAL_* variable with its default, current value and help."""
    return _capture(lambda stream: lib.shoal_config_print(stream, 1 if markdown else 0))
