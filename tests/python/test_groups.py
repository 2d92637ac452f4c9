"""Sub-communicators from Python (docs/groups.md): Communicator.split and create_group over
threads, and Horovod process sets in shoal.torch over processes under shoalrun."""
import numpy as np
import pytest

import shoal
from conftest import run_threads, shoalrun, torch_or_skip


def test_split_by_parity_and_key_order():
    def body(comm):
        child = comm.split(comm.rank % 2, key=-comm.rank)  # reversed order inside each group
        try:
            members = child.allgather(np.array([comm.rank], dtype=np.int64))
            total = child.allreduce(np.array([comm.rank + 1], dtype=np.int64), op="sum")
            return child.rank, child.size, members.tolist(), int(total[0])
        finally:
            child.finalize()

    results = run_threads(4, body)
    assert results[0] == (1, 2, [2, 0], 4)
    assert results[1] == (1, 2, [3, 1], 6)
    assert results[2] == (0, 2, [2, 0], 4)
    assert results[3] == (0, 2, [3, 1], 6)


def test_split_undefined_color_and_create_group():
    def body(comm):
        left_out = comm.split(None if comm.rank == 0 else 1)
        group = comm.create_group([2, 0])
        out = (left_out is None, None if group is None else (group.rank, group.size))
        if group is not None:
            value = group.allreduce(np.array([10 * (comm.rank + 1)], dtype=np.int32), op="sum")
            out += (int(value[0]),)
            group.finalize()
        if left_out is not None:
            left_out.finalize()
        # The parent still works after its children.
        out += (int(comm.allreduce(np.array([1], dtype=np.int32), op="sum")[0]),)
        return out

    results = run_threads(3, body)
    assert results[0] == (True, (1, 2), 40, 3)
    assert results[1] == (False, None, 3)
    assert results[2] == (False, (0, 2), 40, 3)


def test_create_group_mismatch_raises_on_every_rank():
    def body(comm):
        with pytest.raises(shoal.ShoalError) as caught:
            comm.create_group([0, 1] if comm.rank != 1 else [1, 2])
        return caught.value.status_name

    assert run_threads(3, body) == ["SHOAL_ERR_MISMATCH"] * 3


def test_split_argument_types():
    def body(comm):
        with pytest.raises(TypeError, match="color"):
            comm.split("red")
        with pytest.raises(TypeError, match="ranks"):
            comm.create_group([0.5])
        return True

    assert run_threads(1, body) == [True]


def test_horovod_process_sets():
    torch_or_skip()
    rc, out = shoalrun(4, "torch_process_sets.py", timeout_s=180)
    assert rc == 0, out
    assert out.count("torch_process_sets OK on 4 ranks") == 4, out
