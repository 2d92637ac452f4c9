"""shoal.torch.alltoall (Horovod's semantics) against exact values: even and uneven splits,
zero rows, every dtype, received_splits, autograd, the async form, and a splits error.
Run under shoalrun -np N; exits non-zero on any mismatch."""
import torch

import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64]


def rows(sender, receiver, count, dtype, width=3):
    """The rows sender sends receiver: values that name both, exact in every dtype."""
    base = torch.arange(count * width).view(count, width) % 7
    return (base + 10 * sender + receiver).to(dtype)


def split_count(sender, receiver):
    return (sender + 2 * receiver) % 3  # zero rows for some pairs


for dtype in DTYPES:
    # Even split: splits=None, one block of 2 rows per peer; returns only the tensor.
    x = torch.cat([rows(R, p, 2, dtype) for p in range(N)])
    got = hvd.alltoall(x)
    want = torch.cat([rows(p, R, 2, dtype) for p in range(N)])
    assert got.dtype == dtype and torch.equal(got, want), ("even", dtype, got, want)
    # Uneven splits: (tensor, received_splits).
    splits = [split_count(R, p) for p in range(N)]
    x = torch.cat([rows(R, p, splits[p], dtype) for p in range(N)])
    got, received = hvd.alltoall(x, splits=splits)
    want = torch.cat([rows(p, R, split_count(p, R), dtype) for p in range(N)])
    assert torch.equal(got, want), ("uneven", dtype, got, want)
    assert received.tolist() == [split_count(p, R) for p in range(N)], received

# splits as a tensor, the async form, and autograd (the gradient goes back to its sender).
splits = torch.tensor([split_count(R, p) for p in range(N)], dtype=torch.int32)
x = torch.cat([rows(R, p, int(splits[p]), torch.float32) for p in range(N)]).requires_grad_()
handle = hvd.alltoall_async(x.detach(), splits=splits)
got, received = hvd.synchronize(handle)
out, _ = hvd.alltoall(x, splits=splits)
assert torch.equal(out.detach(), got)
(out * (R + 1)).sum().backward()
assert torch.equal(x.grad, torch.cat([torch.full((int(splits[p]), 3), float(p + 1)) for p in range(N)])), x.grad

# The async form is a runtime request: negotiated into one order with requests other ranks
# submitted in another order.
x = torch.cat([rows(R, p, 2, torch.float32) for p in range(N)])
y = torch.full((4,), float(R))
if R % 2:
    h1 = hvd.alltoall_async(x, name="a2a.async")
    h2 = hvd.allreduce_async(y, name="ar.async", op=hvd.Sum)
else:
    h2 = hvd.allreduce_async(y, name="ar.async", op=hvd.Sum)
    h1 = hvd.alltoall_async(x, name="a2a.async")
assert torch.equal(hvd.synchronize(h1), torch.cat([rows(p, R, 2, torch.float32) for p in range(N)]))
assert torch.equal(hvd.synchronize(h2), torch.full((4,), float(N * (N - 1) // 2)))

try:
    hvd.alltoall(torch.zeros(5, 2), splits=[1] * (N + 1))
    raise AssertionError("no error for a wrong splits length")
except ValueError as error:
    assert "splits" in str(error), error
hvd.barrier()
print("torch_alltoall OK on %d ranks" % N)
