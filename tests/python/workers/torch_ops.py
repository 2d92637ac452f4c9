"""Every shoal.torch operation, every dtype torch and shoal share, against exact values.
Run under shoalrun -np N; exits non-zero (with the failed assertion) on any mismatch."""
import torch

import shoal
import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64]


def value(rank, dtype, shape=(2, 3)):
    count = 1
    for d in shape:
        count *= d
    return ((torch.arange(count) % 5) + rank + 1).view(shape).to(dtype)


def exact(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), "%s: got %s, want %s" % (what, a, b)


every = [value(r, torch.int64) for r in range(N)]
total = sum(every)
for dtype in DTYPES:
    x = value(R, dtype)
    original = x.clone()
    want = {hvd.Sum: total, hvd.Min: torch.stack(every).min(0).values, hvd.Max: torch.stack(every).max(0).values,
            hvd.Product: torch.stack(every).prod(0)}
    want[hvd.Average] = total / N if dtype.is_floating_point else torch.div(total, N, rounding_mode="trunc")
    for op, w in want.items():
        if op == hvd.Product and dtype in (torch.int8, torch.uint8, torch.float16, torch.bfloat16) and N > 3:
            continue  # the product overflows (or rounds in) these dtypes at 4 ranks
        w = w.to(dtype)
        exact(hvd.allreduce(x, op=op), w, "allreduce %s %s" % (dtype, op))
        exact(x, original, "allreduce leaves its input alone")
        y = x.clone()
        exact(hvd.allreduce_(y, op=op, name="inplace.%s.%s" % (dtype, op)), w, "allreduce_")
        exact(y, w, "allreduce_ in place")
        h = hvd.allreduce_async(x, op=op, name="async.%s.%s" % (dtype, op))
        exact(hvd.synchronize(h), w, "allreduce_async")
        z = x.clone()
        h = hvd.allreduce_async_(z, op=op)
        while not hvd.poll(h):
            pass
        exact(hvd.synchronize(h), w, "allreduce_async_ after poll")
        exact(z, w, "allreduce_async_ in place")
    # average is the default op, as in Horovod
    exact(hvd.allreduce(x), want[hvd.Average].to(dtype), "default op is Average")
    # grouped
    outs = hvd.grouped_allreduce([x, x * 0 + 1], op=hvd.Sum)
    exact(outs[0], total.to(dtype), "grouped_allreduce[0]")
    exact(outs[1], torch.full_like(x, N), "grouped_allreduce[1]")
    g = [x.clone(), x.clone()]
    hvd.grouped_allreduce_(g, op=hvd.Sum)
    exact(g[1], total.to(dtype), "grouped_allreduce_")
    exact(hvd.synchronize(hvd.grouped_allreduce_async([x], op=hvd.Sum))[0], total.to(dtype), "grouped async")
    # allgather: equal and unequal first dims
    exact(hvd.allgather(x), torch.cat([value(r, dtype) for r in range(N)]), "allgather %s" % dtype)
    ragged = torch.full((R + 1, 2), R).to(dtype)
    exact(hvd.allgather(ragged), torch.cat([torch.full((r + 1, 2), r).to(dtype) for r in range(N)]), "allgatherv")
    exact(hvd.synchronize(hvd.allgather_async(x, name="ag.%s" % dtype)), torch.cat([value(r, dtype)
                                                                                  for r in range(N)]), "ag async")
    # broadcast
    root = N - 1
    exact(hvd.broadcast(x, root), value(root, dtype), "broadcast %s" % dtype)
    exact(x, original, "broadcast leaves its input alone")
    b = x.clone()
    hvd.broadcast_(b, 0)
    exact(b, value(0, dtype), "broadcast_")
    b = x.clone()
    exact(hvd.synchronize(hvd.broadcast_async_(b, root)), value(root, dtype), "broadcast_async_")
    exact(b, value(root, dtype), "broadcast_async_ in place")
    exact(hvd.synchronize(hvd.broadcast_async(x, 0)), value(0, dtype), "broadcast_async")
    # reducescatter (even and uneven first dim)
    big = value(R, dtype, (2 * N, 3))
    sums = sum(value(r, torch.int64, (2 * N, 3)) for r in range(N))
    exact(hvd.reducescatter(big, op=hvd.Sum), sums[2 * R:2 * R + 2].to(dtype), "reducescatter %s" % dtype)
    odd = value(R, dtype, (N + 1, 2))
    odd_sum = sum(value(r, torch.int64, (N + 1, 2)) for r in range(N))
    start = R + (1 if R > 0 else 0)
    rows = 2 if R == 0 else 1
    exact(hvd.reducescatter(odd, op=hvd.Sum), odd_sum[start:start + rows].to(dtype), "uneven reducescatter")

# prescale/postscale, compression on integer tensors (left uncompressed), names
x = value(R, torch.float32)
exact(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), total.float(), "pre/postscale")
exact(hvd.allreduce(value(R, torch.int32), op=hvd.Sum, compression=hvd.Compression.fp16), total.int(), "fp16 on int")
exact(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16), total.float(), "fp16")
exact(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16), total.float(), "bf16")

# autograd (Horovod's gradients)
t = value(R, torch.float64).requires_grad_()
(hvd.allreduce(t, op=hvd.Sum) * (R + 1)).sum().backward()
exact(t.grad, torch.full_like(t, sum(r + 1 for r in range(N))).double(), "allreduce gradient")
t = value(R, torch.float64, (R + 1, 2)).requires_grad_()
(hvd.allgather(t) * 2).sum().backward()
exact(t.grad, torch.full_like(t, 2), "allgather gradient")
t = value(R, torch.float64).requires_grad_()
hvd.broadcast(t, 0).sum().backward()
exact(t.grad, torch.ones_like(t) if R == 0 else torch.zeros_like(t), "broadcast gradient")

# helpers
assert hvd.broadcast_object({"from": R, "t": torch.arange(3) + R}, root_rank=N - 1)["from"] == N - 1
assert hvd.allgather_object(("r", R)) == [("r", r) for r in range(N)]
state = {"w": torch.full((2,), float(R)), "b": torch.tensor([R])}
hvd.broadcast_parameters(state, root_rank=0)
exact(state["w"], torch.zeros(2), "broadcast_parameters")
assert hvd.local_size() == N and hvd.local_rank() == R and hvd.cross_size() == 1 and hvd.cross_rank() == 0
assert 0 <= hvd.join() < N
hvd.barrier()

# errors: Adasum, wrong types, mismatched dtypes and shapes under one name (alltoall: torch_alltoall.py)
for call, text in ((lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum"),
                   (lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1),
                                                     op=hvd.Adasum), "Adasum")):
    try:
        call()
        raise AssertionError("no error for " + text)
    except NotImplementedError as error:
        assert text in str(error), error
for bad in (lambda: hvd.allreduce([1, 2, 3]), lambda: hvd.allreduce(torch.zeros(2, dtype=torch.bool)),
            lambda: hvd.allreduce(x, op="sum"), lambda: hvd.allreduce(x, name=3)):
    try:
        bad()
        raise AssertionError("no error for a wrong argument")
    except (TypeError, ValueError):
        pass
for i, mismatch in enumerate((lambda: torch.zeros(3, dtype=torch.float32 if R == 0 else torch.float64),
                 lambda: torch.zeros(3 + R))):
    try:
        hvd.allreduce(mismatch(), name="mismatch.%d" % i)
        raise AssertionError("no error for a mismatch")
    except hvd.HorovodInternalError as error:
        assert isinstance(error, shoal.ShoalError) and error.status_name == "SHOAL_ERR_MISMATCH", error
hvd.barrier()
print("torch_ops OK on", N, "ranks")
hvd.shutdown()
