"""Finds and loads libshoal, declares every exported function, checks the mirrors.

Lookup order: $SHOAL_LIBRARY (a path to libshoal.so), then the copy a wheel
bundles next to this package (shoal/_lib/libshoal.so.0), then the system's
(ctypes.util.find_library("shoal")).

The library is loaded with ctypes.CDLL, never PyDLL: CDLL releases the GIL for
the whole of every call, so a rank blocked in a collective or a wait does not
stop the program's other Python threads.
"""
import ctypes
import ctypes.util
import os

from . import _types as T

EXPECTED_VERSION_MAJOR = 0  # the major version this binding mirrors (include/shoal/shoal.h)

_p = ctypes.c_void_p
_s = ctypes.c_int  # shoal_status_t
_str = ctypes.c_char_p
_size = ctypes.c_size_t
_i = ctypes.c_int
_i64 = ctypes.c_int64
P = ctypes.POINTER

# name -> (restype, argtypes). Every shoal_* symbol libshoal exports is declared
# here; tests/python/test_symbols.py diffs this table against `nm -D`.
DECLARATIONS = {
    # communicator
    "shoal_comm_init": (_s, [P(_p)]),
    "shoal_comm_init_config": (_s, [P(T.Config), P(_p)]),
    "shoal_comm_finalize": (_s, [_p]),
    "shoal_comm_destroy": (_s, [_p]),
    "shoal_comm_rank": (_s, [_p, P(_i)]),
    "shoal_comm_size": (_s, [_p, P(_i)]),
    "shoal_comm_split": (_s, [_p, _i, _i, P(_p)]),
    "shoal_comm_create_group": (_s, [_p, P(_i), _i, P(_p)]),
    "shoal_last_error": (_str, [_p]),
    "shoal_status_string": (_str, [_i]),
    # blocking collectives
    "shoal_allreduce": (_s, [_p, _p, _p, _size, _i, _i]),
    "shoal_allgather": (_s, [_p, _p, _p, _size, _i]),
    "shoal_allgatherv": (_s, [_p, _p, _size, _p, P(_size), P(_size), _i]),
    "shoal_broadcast": (_s, [_p, _p, _p, _size, _i, _i]),
    "shoal_reduce_scatter": (_s, [_p, _p, _p, _size, _i, _i]),
    "shoal_barrier": (_s, [_p]),
    "shoal_alltoall": (_s, [_p, _p, _p, _size, _i]),
    "shoal_alltoallv": (_s, [_p, _p, P(_size), P(_size), _p, P(_size), P(_size), _i]),
    "shoal_reduce": (_s, [_p, _p, _p, _size, _i, _i, _i]),
    "shoal_gather": (_s, [_p, _p, _p, _size, _i, _i]),
    "shoal_gatherv": (_s, [_p, _p, _size, _p, P(_size), P(_size), _i, _i]),
    "shoal_scatter": (_s, [_p, _p, _p, _size, _i, _i]),
    "shoal_scatterv": (_s, [_p, _p, P(_size), P(_size), _p, _size, _i, _i]),
    "shoal_send": (_s, [_p, _p, _size, _i, _i, _i]),
    "shoal_recv": (_s, [_p, _p, _size, _i, _i, _i]),
    "shoal_sendrecv_many": (_s, [_p, _p, _i]),
    "shoal_allreduce_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), _i, P(T.AllreduceOptions)]),
    "shoal_allgather_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor)]),
    "shoal_broadcast_tensor": (_s, [_p, P(T.Tensor), _i]),
    "shoal_reduce_scatter_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), _i]),
    "shoal_alltoall_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor)]),
    "shoal_alltoallv_tensor": (_s, [_p, P(T.Tensor), P(_size), P(_size), P(T.Tensor), P(_size), P(_size)]),
    "shoal_reduce_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), _i, _i]),
    "shoal_gather_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), _i]),
    "shoal_gatherv_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), P(_size), P(_size), _i]),
    "shoal_scatter_tensor": (_s, [_p, P(T.Tensor), P(T.Tensor), _i]),
    "shoal_scatterv_tensor": (_s, [_p, P(T.Tensor), P(_size), P(_size), P(T.Tensor), _i]),
    "shoal_sendrecv_many_tensor": (_s, [_p, _p, _i]),
    # compressors
    "shoal_last_compress_stats": (_s, [_p, P(T.CompressStats)]),
    "shoal_compressor_state_save": (_s, [_p, _str, _str, _str, _p, P(_size)]),
    "shoal_compressor_state_load": (_s, [_p, _str, _str, _str, _p, _size]),
    "shoal_compressors_print": (_s, [_p]),
    "shoal_compressor_lookup": (_s, [_str, P(_p)]),
    # helpers
    "shoal_dtype_size": (_size, [_i]),
    "shoal_dtype_name": (_str, [_i]),
    "shoal_op_name": (_str, [_i]),
    "shoal_dtype_from_name": (_s, [_str, P(_i)]),
    "shoal_op_from_name": (_s, [_str, P(_i)]),
    "shoal_get_version": (_s, [P(_i)]),
    "shoal_built_with": (_i, [_str]),
    "shoal_struct_size": (_size, [_str]),
    "shoal_tensor_init": (_s, [P(T.Tensor), _p, _size, _i]),
    "shoal_config_print": (_s, [_p, _i]),
    # async runtime
    "shoal_async_start": (_s, [_p]),
    "shoal_iallreduce": (_s, [_p, _str, P(T.Tensor), P(T.Tensor), _i, P(T.AsyncOptions), P(_p)]),
    "shoal_iallgather": (_s, [_p, _str, P(T.Tensor), _p, P(_p)]),
    "shoal_ibroadcast": (_s, [_p, _str, P(T.Tensor), _i, P(_p)]),
    "shoal_ireduce_scatter": (_s, [_p, _str, P(T.Tensor), P(T.Tensor), _i, P(_p)]),
    "shoal_ialltoall": (_s, [_p, _str, P(T.Tensor), P(_size), P(_p)]),
    "shoal_request_alltoall_result": (_s, [_p, P(_p), P(_size), P(_size)]),
    "shoal_request_alltoall_copy": (_s, [_p, _p, _size]),
    "shoal_test": (_s, [_p, P(_i)]),
    "shoal_wait": (_s, [_p, ctypes.c_double]),
    "shoal_wait_all": (_s, [P(_p), _i, ctypes.c_double]),
    "shoal_request_error": (_str, [_p]),
    "shoal_request_free": (_s, [_p]),
    "shoal_async_stats": (_s, [_p, P(T.AsyncStats)]),
    "shoal_join": (_s, [_p, ctypes.c_double, P(_i)]),
    # low rank (lowrank.h)
    "shoal_lowrank_plan_create": (_s, [P(T.LowrankMatrix), _i, P(T.LowrankConfig), P(_p)]),
    "shoal_lowrank_plan_destroy": (None, [_p]),
    "shoal_lowrank_plan_sizes": (_s, [_p, P(T.LowrankSizes)]),
    "shoal_lowrank_step": (_s, [_p, _p, P(_p), P(_p), _i]),
    "shoal_lowrank_phase_p": (_s, [_p, P(_p), _p, P(_size)]),
    "shoal_lowrank_phase_q": (_s, [_p, _p, _p, P(_size)]),
    "shoal_lowrank_finish": (_s, [_p, _p, _p, P(_p), _i, _i]),
    "shoal_lowrank_state_save": (_s, [_p, _p, P(_size)]),
    "shoal_lowrank_state_load": (_s, [_p, _p, _size]),
    "shoal_fused_allreduce": (_s, [_p, P(T.Tensor), _i, _i]),
    "shoal_lowrank_factorize": (_s, [_p, _i64, _i64, _i64, _p, _p, _p]),
    "shoal_lowrank_rank": (_i64, [_i64, _i64, _i64]),
}


class LibraryNotFound(ImportError):
    pass


def _candidates():
    env = os.environ.get("SHOAL_LIBRARY")
    if env:
        return [("SHOAL_LIBRARY", env)]
    found = []
    bundled_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")
    if os.path.isdir(bundled_dir):
        for name in sorted(os.listdir(bundled_dir)):
            if name.startswith("libshoal.so"):
                found.append(("the wheel's copy", os.path.join(bundled_dir, name)))
                break
    system = ctypes.util.find_library("shoal")
    if system:
        found.append(("the system's", system))
    return found


def _load():
    candidates = _candidates()
    if not candidates:
        raise LibraryNotFound(
            "shoal: libshoal.so not found: set SHOAL_LIBRARY=/path/to/libshoal.so (e.g. build-nocuda/lib/libshoal.so), "
            "install the wheel (pip install .), or install libshoal where the dynamic linker finds it")
    errors = []
    for origin, path in candidates:
        try:
            return ctypes.CDLL(path), path
        except OSError as error:
            errors.append("%s (%s): %s" % (path, origin, error))
    raise LibraryNotFound("shoal: could not load libshoal: " + "; ".join(errors))


def _declare(lib, path):
    for name, (restype, argtypes) in DECLARATIONS.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise ImportError("shoal: the loaded libshoal (%s) lacks %s; it is older than this binding: "
                              "rebuild it or point SHOAL_LIBRARY at a current one" % (path, name)) from None
        function.restype = restype
        function.argtypes = argtypes


def _check(lib, path):
    version = ctypes.c_int(0)
    if lib.shoal_get_version(ctypes.byref(version)) != 0:
        raise ImportError("shoal: shoal_get_version failed in %s" % path)
    major = version.value // 10000
    if major != EXPECTED_VERSION_MAJOR:
        raise ImportError("shoal: %s is version %d.%d.%d but this binding mirrors major version %d; install matching "
                          "versions" % (path, major, version.value // 100 % 100, version.value % 100,
                                        EXPECTED_VERSION_MAJOR))
    for typedef, mirror in T.MIRRORS.items():
        expected = lib.shoal_struct_size(typedef.encode())
        if expected != ctypes.sizeof(mirror):
            raise ImportError("shoal: struct %s is %d bytes in %s but %d in the binding's mirror (shoal/_types.py); "
                              "the binding and the library do not match" % (typedef, expected, path,
                                                                             ctypes.sizeof(mirror)))
    return version.value


lib, path = _load()
_declare(lib, path)
version_code = _check(lib, path)
