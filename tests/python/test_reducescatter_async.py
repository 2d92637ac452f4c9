"""shoal.torch.reducescatter_async (a named request of the async runtime, shoal_ireduce_scatter) on
CPU tensors under shoalrun, and Communicator.ireduce_scatter on threads."""
import threading

import pytest

from conftest import run_threads, shoalrun, torch_or_skip


def test_torch_reducescatter_async_two_ranks():
    torch_or_skip()
    rc, out = shoalrun(2, "torch_reducescatter.py", timeout_s=120)
    assert rc == 0, out
    assert out.count("torch_reducescatter OK on 2 ranks") == 2, out


def test_communicator_ireduce_scatter_numpy():
    """ireduce_scatter returns before the reduction: rank 0's request stays pending until rank 1
    submits (after rank 0 has seen it pending); shares of uneven rows are exact; out= is filled;
    a dtype disagreement is an error on every rank naming the field."""
    np = pytest.importorskip("numpy")
    import shoal
    pending_seen = threading.Event()

    def body(comm):
        n, r = comm.size, comm.rank
        comm.async_start()  # collective: both ranks start the runtime before rank 1 holds back
        x = np.arange(14, dtype=np.float64).reshape(7, 2) + 100 * r
        if r == 1:
            assert pending_seen.wait(10), "rank 0 never reported its request pending"
        request = comm.ireduce_scatter(x, "rs", op="sum")
        if r == 0:
            assert not request.test(), "the reduce-scatter completed before rank 1 submitted it"
            pending_seen.set()
        got = request.wait()
        total = sum(np.arange(14, dtype=np.float64).reshape(7, 2) + 100 * p for p in range(n))
        base, extra = divmod(7, n)
        start, rows = r * base + min(r, extra), base + (1 if r < extra else 0)
        assert got.shape == (rows, 2) and (got == total[start:start + rows]).all(), got
        out = np.zeros((rows, 2))
        assert comm.ireduce_scatter(x, "rs.max", op="max", out=out).wait() is out
        assert (out == (x - 100 * r + 100 * (n - 1))[start:start + rows]).all(), out
        bad = comm.ireduce_scatter(np.zeros(4, dtype=np.float32 if r else np.float64), "bad")
        with pytest.raises(shoal.ShoalError) as error:
            bad.wait()
        assert error.value.status == -4 and "dtype" in str(error.value), error.value
        with pytest.raises(ValueError):
            comm.ireduce_scatter(np.float64(1.0), "scalar")
        return True

    assert run_threads(2, body) == [True] * 2
