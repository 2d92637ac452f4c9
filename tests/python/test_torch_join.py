"""hvd.join() with uneven data under shoalrun (skipped only without torch)."""
import pytest

from conftest import shoalrun, torch_or_skip


@pytest.mark.parametrize("nranks", [2, 3])
def test_uneven_batches_finish_and_join_returns_the_last_rank(nranks):
    torch_or_skip()
    rc, out = shoalrun(nranks, "torch_join.py", "train", timeout_s=120)
    assert rc == 0, out
    assert out.count("torch_join train OK") == nranks, out


def test_allgather_while_a_rank_joined_fails_on_every_rank():
    torch_or_skip()
    rc, out = shoalrun(2, "torch_join.py", "refuse", timeout_s=120)
    assert rc == 0, out
    assert out.count("torch_join refuse OK") == 2, out


def test_join_threads_exact_sums():
    """The framework-neutral shoal.Communicator.join, ranks as threads: rank r runs r + 1 steps."""
    import numpy as np

    from conftest import run_threads

    def body(comm):
        sums = []
        for step in range(comm.rank + 1):
            x = np.full(4, float(comm.rank + 1), dtype=np.float32)
            comm.iallreduce(x, "x", out=x).wait(30)
            sums.append(float(x[0]))
        return sums, comm.join(30)

    results = run_threads(3, body, timeout_s=60)
    for rank, (sums, last) in enumerate(results):
        # step s: the ranks r >= s still submit, the others add zeros
        assert sums == [float(sum(r + 1 for r in range(3) if r >= s)) for s in range(rank + 1)], sums
        assert last == 2
