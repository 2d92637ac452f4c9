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


def test_communicator_ialltoall_is_async():
    """ialltoall returns before the exchange: rank 0's request stays pending until rank 1
    submits (after rank 0 has seen it pending), then both get the exact rows."""
    np = pytest.importorskip("numpy")
    import shoal
    import threading
    pending_seen = threading.Event()

    def body(comm):
        n, r = comm.size, comm.rank
        comm.async_start()  # collective: both ranks start the runtime before rank 1 holds back
        x = np.array([[10 * r + p, p] for p in range(n)], dtype=np.int32)
        if r == 1:
            assert pending_seen.wait(10), "rank 0 never reported its request pending"
        even = comm.ialltoall(x, "even")
        if r == 0:
            assert not even.test(), "the alltoall completed before rank 1 submitted it"
            pending_seen.set()
        splits = [p % 2 for p in range(n)]
        uneven = comm.ialltoall(np.ones((sum(splits), 2), dtype=np.float64) * r, "uneven", splits)
        got, counts = even.wait()
        assert counts == [1] * n and got.tolist() == [[10 * p + r, r] for p in range(n)]
        got, received = uneven.wait()
        assert received == [r % 2] * n
        assert got.tolist() == [[float(p)] * 2 for p in range(n)] * (r % 2)
        # A dtype disagreement fails the name on every rank.
        bad = comm.ialltoall(np.zeros((n, 1), dtype=np.int32 if r else np.int64), "bad")
        with pytest.raises(shoal.ShoalError) as error:
            bad.wait()
        assert error.value.status == -4 and "dtype" in str(error.value), error.value
        return True

    assert run_threads(2, body) == [True] * 2
