"""Gradient compression for shoal.torch, in Horovod's shape.

Horovod's compressors are Python code that changes a tensor before and after
a plain allreduce. shoal's run inside the collective, in C: each compressor
here only names the C compressor and its options, which travel with the
request, so PowerSGD sees every parameter's real shape and the sketch stays
lossless. compress() and decompress() are kept (as identities) so code that
calls them directly still runs.

A user's own compressor, written to Horovod's interface (a Compressor subclass,
or any object, whose compress()/decompress() do the work in Python), runs as in
Horovod: compress() before a plain allreduce of what it returns, decompress()
after (runs_in_python() tells the two kinds apart).
"""
import torch


class Compressor:
    """Interface as in horovod.torch.compression, plus the C compressor it selects."""
    name = "none"           # the C compressor's name
    options = None          # its "k=v,..." options
    dtypes = ()             # torch dtypes it compresses; other tensors go uncompressed

    @classmethod
    def compress(cls, tensor):
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor

    @classmethod
    def shoal_compressor(cls, tensor):
        """(compressor, options) for this tensor: "none" where the compressor does not take its dtype."""
        if cls.name != "none" and tensor.dtype in cls.dtypes:
            return cls.name, cls.options
        return "none", None

    def __repr__(self):
        return "Compression.%s(%s)" % (self.name, self.options or "")


def runs_in_python(compression):
    """True for a Horovod-style compressor whose compress()/decompress() must run around the
    allreduce (a user's: it overrides them, or is not a shoal Compressor at all); False for shoal's
    own, which name a C compressor and keep the identity compress()/decompress()."""
    if not hasattr(compression, "shoal_compressor"):
        return True
    return (getattr(getattr(compression, "compress", None), "__func__", None) is not Compressor.compress.__func__
            or getattr(getattr(compression, "decompress", None), "__func__", None)
            is not Compressor.decompress.__func__)


class NoneCompressor(Compressor):
    """No compression (the default)."""


class FP16Compressor(Compressor):
    """Floating-point gradients travel as IEEE half; shoal sums in f32 and rounds once per hop,
    and the cast happens in C (so no 'div_cpu not implemented for Half' on CPU tensors)."""
    name = "fp16"
    dtypes = (torch.float32, torch.float64)


class BF16Compressor(Compressor):
    """Floating-point gradients travel as bfloat16 (f32's range, 2x smaller)."""
    name = "bf16"
    dtypes = (torch.float32, torch.float64)


def _spec(name, dtypes, **options):
    text = ",".join("%s=%s" % (k, int(v) if isinstance(v, bool) else v) for k, v in options.items() if v is not None)
    return type("%sCompressor" % name.capitalize(), (Compressor,), {"name": name, "options": text or None,
                                                                    "dtypes": dtypes})()


class Compression:
    """Optional gradient compression used during allreduce (horovod.torch.Compression plus shoal's own)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def topk(ratio=0.01, k=None, ef=True):
        """Top-k sparsification with error feedback: each rank sends its largest |g + e| (f32, f64)."""
        if k is not None:
            return _spec("topk", (torch.float32, torch.float64), k=int(k), ef=ef)
        return _spec("topk", (torch.float32, torch.float64), ratio=float(ratio), ef=ef)

    @staticmethod
    def powersgd(rank=4, start_iter=0, ef=True, min_compression_rate=None, seed=None):
        """PowerSGD at the given rank; plain allreduces for the first start_iter compressed calls
        (f32, f16, bf16; 1-D and small tensors ride densely)."""
        return _spec("powersgd", (torch.float32, torch.float16, torch.bfloat16), rank=int(rank),
                     start_iter=int(start_iter), ef=ef, min_compression_rate=min_compression_rate, seed=seed)

    @staticmethod
    def sketch(**options):
        """Lossless homomorphic compression of sparse f32 gradients (options: values=, index=, ratio=, ...;
        see `shoalrun --list-compressors`)."""
        return _spec("sketch", (torch.float32,), **options)
