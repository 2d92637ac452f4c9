"""shoal.torch.reducescatter_async on CPU tensors (Horovod's semantics, a named request of the async
runtime) against exact values: even and uneven first dims (fewer rows than ranks too), every op,
prescale/postscale, a request that stays pending until its peer submits it, order with an allreduce
submitted in another order on each rank, the blocking form with its gradient, and a mismatch's text.
Run under shoalrun -np N; exits non-zero on any mismatch."""
import torch

import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()


def share(rows):
    """This rank's first row and row count (the first rows % N ranks get one more)."""
    base, extra = divmod(rows, N)
    return R * base + min(R, extra), base + (1 if R < extra else 0)


def contribution(rank, rows, dtype):
    """Small positive integers: every op's result is exact in every dtype used."""
    return ((torch.arange(rows * 3).view(rows, 3) + 2 * rank) % 5 + 1).to(dtype)


def reduced(op, rows, dtype):
    every = torch.stack([contribution(r, rows, dtype) for r in range(N)])
    if op == hvd.Sum:
        return every.sum(0).to(dtype)
    if op == hvd.Average:  # the C average: the sum divided by N in the dtype (integers truncate)
        total = every.sum(0).to(dtype)
        return total / N if dtype.is_floating_point else torch.div(total, N, rounding_mode="floor")
    if op == hvd.Min:
        return every.min(0).values
    if op == hvd.Max:
        return every.max(0).values
    return every.prod(0).to(dtype)


for rows in (2 * N, 2 * N + 1, 1):
    for dtype in (torch.float32, torch.float64, torch.int32):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            name = "rs.%d.%s.%d" % (rows, dtype, op)
            got = hvd.synchronize(hvd.reducescatter_async(contribution(R, rows, dtype), name=name, op=op))
            start, count = share(rows)
            want = reduced(op, rows, dtype)[start:start + count]
            assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want), (name, got, want)

# prescale and postscale around the request (halves and triples of small integers: exact).
x = contribution(R, 2 * N + 1, torch.float32)
got = hvd.synchronize(hvd.reducescatter_async(x, name="rs.scaled", op=hvd.Sum, prescale_factor=0.5,
                                              postscale_factor=3.0))
start, count = share(2 * N + 1)
want = (reduced(hvd.Sum, 2 * N + 1, torch.float32) * 0.5 * 3.0)[start:start + count]
assert torch.equal(got, want), (got, want)
assert torch.equal(x, contribution(R, 2 * N + 1, torch.float32)), "the input changed"

# The request is asynchronous: rank 0's stays pending until rank 1 submits it (after a barrier
# that rank 0 reaches only after submitting). A reducescatter that ran at submission would block
# rank 0 before the barrier instead.
if R == 0:
    pending = hvd.reducescatter_async(x, name="rs.pending", op=hvd.Sum)
    assert not hvd.poll(pending), "rs.pending completed before the other ranks submitted it"
    hvd.barrier()
else:
    hvd.barrier()
    pending = hvd.reducescatter_async(x, name="rs.pending", op=hvd.Sum)
assert torch.equal(hvd.synchronize(pending), reduced(hvd.Sum, 2 * N + 1, torch.float32)[start:start + count])

# Negotiated into one order with an allreduce that other ranks submitted in another order.
y = torch.full((4,), float(R))
if R % 2:
    h1 = hvd.reducescatter_async(x, name="rs.order", op=hvd.Max)
    h2 = hvd.allreduce_async(y, name="ar.order", op=hvd.Sum)
else:
    h2 = hvd.allreduce_async(y, name="ar.order", op=hvd.Sum)
    h1 = hvd.reducescatter_async(x, name="rs.order", op=hvd.Max)
assert torch.equal(hvd.synchronize(h1), reduced(hvd.Max, 2 * N + 1, torch.float32)[start:start + count])
assert torch.equal(hvd.synchronize(h2), torch.full((4,), float(N * (N - 1) // 2)))

# The blocking form goes through the same request; its gradient is an allgather (Average: as is).
z = contribution(R, 2 * N, torch.float64).requires_grad_()
out = hvd.reducescatter(z, name="rs.grad")
assert torch.equal(out.detach(), reduced(hvd.Average, 2 * N, torch.float64)[2 * R:2 * R + 2])
(out * (R + 1)).sum().backward()
assert torch.equal(z.grad, torch.cat([torch.full((2, 3), float(p + 1), dtype=torch.float64) for p in range(N)])), \
    z.grad

# Ranks that disagree on a name's dtype: an error on every rank, naming the field.
try:
    hvd.synchronize(hvd.reducescatter_async(torch.zeros(4, dtype=torch.float32 if R else torch.float64),
                                            name="rs.bad", op=hvd.Sum))
    raise AssertionError("no error for a dtype that differs between ranks")
except hvd.HorovodInternalError as error:
    assert error.status == -4 and "dtype" in str(error) and "reduce-scatter" in str(error), error
hvd.barrier()
print("torch_reducescatter OK on %d ranks" % N)
