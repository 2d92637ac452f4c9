"""shoal.torch.alltoall and Communicator.alltoall: multi-process (shoalrun) and threads."""
import pytest

from conftest import run_threads, shoalrun, torch_or_skip


@pytest.mark.parametrize("nranks", [1, 3])
def test_torch_alltoall(nranks):
    torch_or_skip()
    rc, out = shoalrun(nranks, "torch_alltoall.py", timeout_s=120)
    assert rc == 0, out
    assert out.count("torch_alltoall OK on %d ranks" % nranks) == nranks, out


def test_communicator_alltoall_numpy():
    np = pytest.importorskip("numpy")

    def body(comm):
        n, r = comm.size, comm.rank
        x = np.array([[10 * r + p, p] for p in range(n)], dtype=np.int32)
        even, counts = comm.alltoall(x)
        assert counts == [1] * n
        assert even.tolist() == [[10 * p + r, r] for p in range(n)]
        splits = [p % 2 for p in range(n)]  # rank r sends one row to odd ranks
        uneven, received = comm.alltoall(np.ones((sum(splits), 2), dtype=np.float64) * r, splits)
        assert received == [r % 2] * n
        assert uneven.tolist() == [[float(p)] * 2 for p in range(n)] * (r % 2)
        return True

    assert run_threads(3, body) == [True] * 3
