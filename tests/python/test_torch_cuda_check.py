"""shoal.torch's device checks, on the CPU: CUDA tensors are taken by every operation
(allreduce, allgather, broadcast, reducescatter, alltoall and alltoall_async) exactly when
libshoal was built with CUDA (cuda_built(), from shoal_built_with), and refused with a TypeError
otherwise. A CPU-only torch has no CUDA tensor, so a tensor that says it is on cuda:0 stands in
for one; it never reaches the library. The binding's own device cases skip without a device."""
import pytest

from conftest import torch_or_skip


def fake_cuda_tensor(torch):
    class FakeCuda(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

    return torch.zeros(4).as_subclass(FakeCuda)


def test_cuda_built_is_what_the_library_says():
    torch_or_skip()
    import shoal.torch as hvd
    from shoal._lib import lib
    assert hvd.cuda_built() == bool(lib.shoal_built_with(b"cuda"))
    assert hvd.nccl_built() == (1 if lib.shoal_built_with(b"nccl") else 0)
    assert lib.shoal_built_with(b"no-such-feature") == 0
    assert lib.shoal_built_with(None) == 0


def test_cuda_tensors_follow_the_build(monkeypatch):
    torch = torch_or_skip()
    from shoal.torch import mpi_ops
    fake = fake_cuda_tensor(torch)
    assert fake.device.type == "cuda"
    mpi_ops._check_tensor(torch.zeros(2), cuda_ok=True)  # CPU tensors always pass

    # Past the check an operation asks for its communicator: this stands in for it, so reaching it
    # means the tensor was taken (nothing reaches the library).
    class ReachedTheCommunicator(Exception):
        pass

    def reached(*args, **kwargs):
        raise ReachedTheCommunicator()
    monkeypatch.setattr(mpi_ops, "_comm", reached)
    monkeypatch.setattr(mpi_ops, "_comm_of", reached)
    operations = {"allreduce": lambda: mpi_ops.allreduce_async(fake),
                  "broadcast": lambda: mpi_ops.broadcast_async(fake, 0),
                  "reducescatter": lambda: mpi_ops.reducescatter(fake),
                  "reducescatter_async": lambda: mpi_ops.reducescatter_async(fake),
                  "alltoall": lambda: mpi_ops.alltoall(fake),
                  "alltoall with splits": lambda: mpi_ops.alltoall(fake, splits=[4]),
                  "alltoall_async": lambda: mpi_ops.alltoall_async(fake)}

    monkeypatch.setattr(mpi_ops, "cuda_built", lambda: False)
    with pytest.raises(TypeError, match="built without CUDA"):
        mpi_ops._check_tensor(fake, cuda_ok=True)
    for op in operations.values():  # refused before any communicator is needed
        with pytest.raises(TypeError, match="built without CUDA"):
            op()

    monkeypatch.setattr(mpi_ops, "cuda_built", lambda: True)
    mpi_ops._check_tensor(fake, cuda_ok=True)
    for op in operations.values():  # every operation takes CUDA tensors in a CUDA build
        with pytest.raises(ReachedTheCommunicator):
            op()
    with pytest.raises(TypeError, match="this operation takes CPU tensors"):
        mpi_ops._check_tensor(fake)  # the check's default (no caller here uses it)
    with pytest.raises(TypeError, match="shoal.torch takes CPU tensors"):
        mpi_ops._check_tensor(torch.zeros(2, device="meta"), cuda_ok=True)


def test_the_communicator_describes_cuda_tensors_where_the_c_call_takes_them(monkeypatch):
    """Which Communicator methods let a CUDA tensor through to the library (B.describe(cuda=True)):
    the ones whose C call takes CUDA tensors, alltoall and reduce_scatter included."""
    import shoal
    from shoal import _comm

    class Described(Exception):
        pass

    def describe(obj, what="the tensor", writable=False, cuda=False):
        raise Described(cuda)
    monkeypatch.setattr(_comm.B, "describe", describe)
    comm = object.__new__(shoal.Communicator)  # never initialised: describe() comes first in each method
    comm.size, comm.rank = 2, 0
    calls = {"allreduce": (lambda x: comm.allreduce(x), True),
             "reduce_scatter": (lambda x: comm.reduce_scatter(x), True),
             "alltoall": (lambda x: comm.alltoall(x), True),
             "ialltoall": (lambda x: comm.ialltoall(x, "a2a"), True),
             "iallreduce": (lambda x: comm.iallreduce(x, "g"), True),
             "allgather": (lambda x: comm.allgather(x), False),
             "broadcast": (lambda x: comm.broadcast(x), False)}
    for what, (call, cuda) in calls.items():
        with pytest.raises(Described) as described:
            call(object())
        assert described.value.args[0] is cuda, what


def test_cuda_alltoall_and_reduce_scatter_on_a_device():
    """The CUDA paths of the binding on a device, against the host results: blocking alltoall (even
    and with splits), the async alltoall's copy into a torch CUDA tensor, and reduce_scatter.
    One rank per device (NCCL), at most two, as threads. Skips without a device or a CUDA build."""
    torch = torch_or_skip()
    from shoal._lib import lib
    if not lib.shoal_built_with(b"cuda") or not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of libshoal and a CUDA device (torch.cuda.is_available())")
    from conftest import run_threads
    n = min(torch.cuda.device_count(), 2)

    def body(comm):
        device = torch.device("cuda", comm.rank)
        torch.cuda.set_device(device)
        x = torch.arange(4 * n, dtype=torch.float32).reshape(2 * n, 2) + 100 * comm.rank
        even, even_counts = comm.alltoall(x.to(device))
        splits = [comm.rank + 1 + p for p in range(n)]
        rows = torch.arange(sum(splits) * 3, dtype=torch.int32).reshape(-1, 3) + 1000 * comm.rank
        uneven, uneven_counts = comm.alltoall(rows.to(device), splits)
        request = comm.ialltoall(rows.to(device), "a2a", splits)
        async_rows, async_counts = request.wait()
        scattered = comm.reduce_scatter(x.to(device), op="max")
        host = (comm.alltoall(x), comm.alltoall(rows, splits), comm.reduce_scatter(x, op="max"))
        return (even, even_counts, uneven, uneven_counts, async_rows, async_counts, scattered), host

    for (even, even_counts, uneven, uneven_counts, async_rows, async_counts, scattered), host in run_threads(n, body):
        assert even.device.type == "cuda" and async_rows.device.type == "cuda" and scattered.device.type == "cuda"
        assert torch.equal(even.cpu(), host[0][0]) and even_counts == host[0][1]
        assert torch.equal(uneven.cpu(), host[1][0]) and uneven_counts == host[1][1]
        assert torch.equal(async_rows.cpu(), host[1][0]) and async_counts == host[1][1]
        assert torch.equal(scattered.cpu(), host[2])


def test_the_binding_takes_cuda_tensors_only_where_asked():
    torch = torch_or_skip()
    from shoal import _buffers
    fake = fake_cuda_tensor(torch)
    with pytest.raises(TypeError, match="takes CPU tensors"):
        _buffers.describe(fake, "x")  # the blocking calls, alltoall, ...: host memory only
    host = _buffers.describe(torch.arange(4, dtype=torch.float32), "x", cuda=True)
    assert host.tensor.memory == 0  # a CPU tensor stays host memory where CUDA is allowed
