"""ctypes mirrors of the public structs in include/shoal/shoal.h and lowrank.h.

Each mirror is checked against the loaded library's shoal_struct_size at import
(see _lib.py), so a header change that is not copied here fails loudly instead
of corrupting memory.
"""
import ctypes

MAX_DIMS = 8

# enum shoal_dtype (values as in shoal.h).
F16, BF16, F32, F64, I8, U8, I32, U32, I64, U64 = range(10)
DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64")
DTYPE_SIZES = (2, 2, 4, 8, 1, 1, 4, 4, 8, 8)

# enum shoal_op.
SUM, AVG, PROD, MIN, MAX, BAND, BOR, BXOR = range(8)
OP_NAMES = ("sum", "avg", "prod", "min", "max", "band", "bor", "bxor")

MEMORY_HOST = 0
MEMORY_CUDA = 1
LOWRANK_DENSE = 1


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("memory", ctypes.c_int),
        ("device", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("store", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("timeout_s", ctypes.c_double),
        ("algorithm", ctypes.c_char_p),
    ]


class AllreduceOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("compressor", ctypes.c_char_p),
        ("compressor_options", ctypes.c_char_p),
        ("compress_min_bytes", ctypes.c_longlong),
    ]


class CompressStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("compressor", ctypes.c_char_p),
        ("input_bytes", ctypes.c_uint64),
        ("payload_bytes", ctypes.c_uint64),
        ("wire_bytes", ctypes.c_uint64),
        ("rounds", ctypes.c_int),
    ]


class AsyncOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("compressor", ctypes.c_char_p),
        ("compressor_options", ctypes.c_char_p),
        ("compress_min_bytes", ctypes.c_longlong),
    ]


class AsyncStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("cycles", ctypes.c_uint64),
        ("full_rounds", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64),
        ("tensors", ctypes.c_uint64),
        ("groups", ctypes.c_uint64),
        ("negotiation_us", ctypes.c_double),
    ]


class LowrankMatrix(ctypes.Structure):
    _fields_ = [
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("rank", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
    ]


class LowrankConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("rank", ctypes.c_int32),
        ("error_feedback", ctypes.c_int32),
        ("min_compression_rate", ctypes.c_double),
        ("start_iter", ctypes.c_uint64),
        ("seed", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("memory", ctypes.c_int),
        ("device", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    ]


class LowrankSizes(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("p_elems", ctypes.c_size_t),
        ("q_elems", ctypes.c_size_t),
        ("compressed", ctypes.c_size_t),
        ("dense_elems", ctypes.c_size_t),
        ("workspace_bytes", ctypes.c_size_t),
        ("state_bytes", ctypes.c_size_t),
    ]


# typedef name in the C headers -> mirror; checked against shoal_struct_size at import.
MIRRORS = {
    "shoal_tensor_t": Tensor,
    "shoal_config_t": Config,
    "shoal_allreduce_options_t": AllreduceOptions,
    "shoal_compress_stats_t": CompressStats,
    "shoal_async_options_t": AsyncOptions,
    "shoal_async_stats_t": AsyncStats,
    "shoal_lowrank_matrix_t": LowrankMatrix,
    "shoal_lowrank_config_t": LowrankConfig,
    "shoal_lowrank_sizes_t": LowrankSizes,
}


def new(struct_type, **fields):
    """A mirror with struct_size set, as the C side's SHOAL_*_INIT macros do."""
    value = struct_type(**fields)
    if "struct_size" in dict(struct_type._fields_):
        value.struct_size = ctypes.sizeof(struct_type)
    return value
