"""shoal.torch's device checks, on the CPU: CUDA tensors are taken by allreduce, allgather and
broadcast exactly when libshoal was built with CUDA (cuda_built(), from shoal_built_with), and
refused with a TypeError otherwise and by the other operations. A CPU-only torch has no CUDA
tensor, so a tensor that says it is on cuda:0 stands in for one; it never reaches the library."""
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

    monkeypatch.setattr(mpi_ops, "cuda_built", lambda: False)
    with pytest.raises(TypeError, match="built without CUDA"):
        mpi_ops._check_tensor(fake, cuda_ok=True)
    with pytest.raises(TypeError, match="built without CUDA"):
        mpi_ops.allreduce_async(fake)  # refused before any communicator is needed

    monkeypatch.setattr(mpi_ops, "cuda_built", lambda: True)
    mpi_ops._check_tensor(fake, cuda_ok=True)  # accepted: allreduce, allgather, broadcast
    for op in (lambda: mpi_ops.reducescatter(fake), lambda: mpi_ops.alltoall(fake),
               lambda: mpi_ops.alltoall_async(fake)):
        with pytest.raises(TypeError, match="this operation takes CPU tensors"):
            op()
    with pytest.raises(TypeError, match="shoal.torch takes CPU tensors"):
        mpi_ops._check_tensor(torch.zeros(2, device="meta"), cuda_ok=True)


def test_the_binding_takes_cuda_tensors_only_where_asked():
    torch = torch_or_skip()
    from shoal import _buffers
    fake = fake_cuda_tensor(torch)
    with pytest.raises(TypeError, match="takes CPU tensors"):
        _buffers.describe(fake, "x")  # the blocking calls, alltoall, ...: host memory only
    host = _buffers.describe(torch.arange(4, dtype=torch.float32), "x", cuda=True)
    assert host.tensor.memory == 0  # a CPU tensor stays host memory where CUDA is allowed
