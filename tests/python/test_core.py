"""The framework-neutral binding (package shoal) on numpy arrays, ranks as threads over memory://."""
import ctypes
import threading
import time

import numpy as np
import pytest

import shoal
from conftest import run_threads

DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
NRANKS = 3


def contribution(rank, count, dtype):
    """Rank r's input: small integers, so every op's result is exact in every dtype."""
    return ((np.arange(count) % 5) + rank + 1).astype(dtype)


def expected(op, count, dtype, nranks=NRANKS):
    xs = [contribution(r, count, dtype).astype(np.int64) for r in range(nranks)]
    if op == "sum":
        return sum(xs).astype(dtype)
    if op == "avg":
        total = sum(xs)
        if np.dtype(dtype).kind == "f":
            return (total / nranks).astype(dtype)
        return (total // nranks).astype(dtype)  # non-negative: truncation == floor
    if op == "prod":
        out = xs[0]
        for x in xs[1:]:
            out = out * x
        return out.astype(dtype)
    if op == "min":
        return np.minimum.reduce(xs).astype(dtype)
    if op == "max":
        return np.maximum.reduce(xs).astype(dtype)
    if op == "band":
        return np.bitwise_and.reduce(xs).astype(dtype)
    if op == "bor":
        return np.bitwise_or.reduce(xs).astype(dtype)
    if op == "bxor":
        return np.bitwise_xor.reduce(xs).astype(dtype)
    raise AssertionError(op)


def test_version_and_library():
    assert shoal.__version__.count(".") == 2
    assert shoal.version_code >= 100 or shoal.version_code >= 0
    assert shoal.library_path
    text = shoal.compressors()
    for name in ("none", "fp16", "bf16", "topk", "sketch", "powersgd"):
        assert "\n" + name in "\n" + text
    assert "SHOAL_TIMEOUT_S" in shoal.config_text()


def test_struct_mirrors_match_library():
    from shoal import _lib, _types
    for typedef, mirror in _types.MIRRORS.items():
        assert _lib.lib.shoal_struct_size(typedef.encode()) == ctypes.sizeof(mirror), typedef


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_op_in_and_out_of_place(dtype):
    ops = ["sum", "avg", "prod", "min", "max"]
    if np.dtype(dtype).kind in "iu":
        ops += ["band", "bor", "bxor"]
    count = 11

    def body(comm):
        out = {}
        for op in ops:
            x = contribution(comm.rank, count, dtype)
            y = comm.allreduce(x, op=op)                  # out of place: x unchanged
            assert np.array_equal(x, contribution(comm.rank, count, dtype))
            z = contribution(comm.rank, count, dtype)
            assert comm.allreduce(z, out=z, op=op) is z   # in place
            out[op] = (y, z)
        return out

    for result in run_threads(NRANKS, body):
        for op, (y, z) in result.items():
            want = expected(op, count, dtype)
            assert y.dtype == np.dtype(dtype) and np.array_equal(y, want), (op, y, want)
            assert np.array_equal(z, want), op


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_broadcast_reduce_scatter(dtype):
    def body(comm):
        x = contribution(comm.rank, 4, dtype).reshape(2, 2)
        gathered = comm.allgather(x)
        ragged = comm.allgatherv(np.full((comm.rank + 1, 2), comm.rank, dtype=dtype))
        b_out = comm.broadcast(x, root=1)
        b_in = contribution(comm.rank, 4, dtype)
        comm.broadcast(b_in, root=2, out=b_in)
        rs = comm.reduce_scatter(contribution(comm.rank, 3 * NRANKS, dtype).reshape(NRANKS, 3), op="sum")
        comm.barrier()
        return gathered, ragged, b_out, b_in, rs

    full = expected("sum", 3 * NRANKS, dtype).reshape(NRANKS, 3)
    for rank, (gathered, ragged, b_out, b_in, rs) in enumerate(run_threads(NRANKS, body)):
        assert gathered.shape == (2 * NRANKS, 2)
        assert np.array_equal(gathered, np.concatenate([contribution(r, 4, dtype).reshape(2, 2)
                                                        for r in range(NRANKS)]))
        assert np.array_equal(ragged, np.concatenate([np.full((r + 1, 2), r, dtype=dtype) for r in range(NRANKS)]))
        assert np.array_equal(b_out, contribution(1, 4, dtype).reshape(2, 2))
        assert np.array_equal(b_in, contribution(2, 4, dtype))
        assert rs.shape == (1, 3) and np.array_equal(rs[0], full[rank])


def test_read_only_and_foreign_inputs_go_to_fresh_outputs():
    def body(comm):
        ro = np.arange(4, dtype=np.float32)
        ro.flags.writeable = False
        y = comm.allreduce(ro)
        with pytest.raises(ValueError, match="read-only"):
            comm.allreduce(ro, out=ro)
        from_buffer = comm.allreduce(bytes([1, 2, 3]))               # the buffer protocol (read-only bytes)
        dl = comm.allreduce(np.from_dlpack(np.arange(3, dtype=np.int32)))  # a DLPack producer
        strided = comm.allreduce(np.arange(8, dtype=np.int64)[::2])  # a non-contiguous input is copied
        return y, from_buffer, dl, strided

    for y, fb, dl, strided in run_threads(2, body):
        assert np.array_equal(y, np.arange(4, dtype=np.float32) * 2)
        assert fb.dtype == np.uint8 and np.array_equal(fb, [2, 4, 6])
        assert np.array_equal(dl, [0, 2, 4])
        assert np.array_equal(strided, [0, 4, 8, 12])


def test_wrong_arguments_are_errors():
    def body(comm):
        with pytest.raises(TypeError, match="not an array"):
            comm.allreduce(object())
        with pytest.raises(TypeError, match="dtype"):
            comm.allreduce(np.zeros(3, dtype=np.complex64))
        with pytest.raises(ValueError, match="unknown op"):
            comm.allreduce(np.zeros(3), op="median")
        with pytest.raises(ValueError, match="holds 2 elements"):
            comm.allreduce(np.zeros(3), out=np.zeros(2))
        with pytest.raises(TypeError, match="dtype"):
            comm.allreduce(np.zeros(3, np.float32), out=np.zeros(3, np.float64))
        with pytest.raises(ValueError, match="root"):
            comm.broadcast(np.zeros(3), root=comm.size)
        with pytest.raises(shoal.ShoalError) as info:    # checked by the C library
            comm.allreduce(np.zeros(3, np.float32), op="band")
        assert info.value.status_name == "SHOAL_ERR_INVALID_ARGUMENT" and "band" in info.value.message
        with pytest.raises(shoal.ShoalError, match="compressor"):
            comm.allreduce(np.zeros(3, np.float32), compressor="no-such-compressor")
        with pytest.raises(shoal.ShoalError, match="name"):
            comm.iallreduce(np.zeros(3, np.float32), name="")
        comm.barrier()

    run_threads(2, body)
    with pytest.raises(shoal.ShoalError):
        shoal.Communicator(rank=0, world_size=1, store="nosuchscheme://x")
    with pytest.raises(TypeError):
        shoal.Communicator(rank="0", world_size=1)


def test_gil_is_released_while_blocked():
    """Rank 1 joins the collective only after rank 0 has been blocked in it for a while:
    if the blocking call held the GIL, rank 1 (and the counter) could never run."""
    ticks = []
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    def body(comm):
        if comm.rank == 1:
            time.sleep(0.5)
        start = time.monotonic()
        out = comm.allreduce(np.ones(4, np.float32))
        return start, time.monotonic(), out

    t = threading.Thread(target=counter)
    t.start()
    try:
        results = run_threads(2, body)
    finally:
        stop.set()
        t.join()
    start, end, out = results[0]
    assert end - start >= 0.4 and np.array_equal(out, [2, 2, 2, 2])
    assert sum(1 for x in ticks if start < x < end) >= 20


def test_async_requests_keep_arrays_alive_and_negotiate_order():
    def body(comm):
        names = ["a", "b", "c"]
        order = names if comm.rank == 0 else names[::-1]   # ranks submit in different orders
        requests = {n: comm.iallreduce(np.full(5, comm.rank + i + 1, np.float32), name=n, op="sum")
                    for i, n in enumerate(order)}
        gathered = comm.iallgather(np.array([comm.rank], np.int64), name="g")
        bcast = comm.ibroadcast(np.array([comm.rank * 10], np.int32), name="bc", root=1)
        results = shoal.wait_all([requests[n] for n in names] + [gathered, bcast], timeout_s=10)
        assert requests["a"].test() and requests["a"].done
        inplace = np.ones(3, np.float64)
        r = comm.iallreduce(inplace, name="inplace", out=inplace, op="avg")
        assert r.wait(timeout_s=10) is inplace
        stats = comm.async_stats()
        return results, stats

    for results, stats in run_threads(2, body):
        a, b, c, g, bc = results
        # rank 0 gives a, b, c the values 1, 2, 3; rank 1 (reversed order) 4, 3, 2: every sum is 5.
        for value in (a, b, c):
            assert np.array_equal(value, np.full(5, 5))
        assert np.array_equal(g, [0, 1]) and np.array_equal(bc, [10])
        assert stats["tensors"] >= 6 and stats["cycles"] >= 1


def test_prepared_inplace_allreduce_is_iallreduce_described_once():
    """Communicator.prepare_iallreduce/submit_prepared (DistributedOptimizer's per-step path):
    the same results as iallreduce step after step, and a tensor that no longer fits is refused."""
    def body(comm):
        x = np.zeros(6, np.float32)
        plan = comm.prepare_iallreduce(x, "prepared", op="sum")
        results = []
        for step in range(3):
            x[:] = comm.rank + 1 + step
            request = comm.submit_prepared(plan, x)
            assert request.wait(timeout_s=10) is x
            results.append(x.copy())
        assert plan.matches(x) and not plan.matches(x[1:]) and not plan.matches(x.astype(np.float64))
        with pytest.raises(ValueError, match="prepare it again"):
            comm.submit_prepared(plan, np.zeros(6, np.float32))
        y = np.arange(4, dtype=np.float32) + comm.rank
        with_compressor = comm.prepare_iallreduce(y, "prepared.fp16", op="avg", compressor="fp16")
        comm.submit_prepared(with_compressor, y).wait(timeout_s=10)
        return results, y

    for results, y in run_threads(2, body):
        for step, value in enumerate(results):
            assert np.array_equal(value, np.full(6, 3 + 2 * step, np.float32))
        assert np.array_equal(y, np.arange(4, dtype=np.float32) + 0.5)


def test_async_mismatch_is_an_error_on_every_rank():
    def body(comm):
        dtype = np.float32 if comm.rank == 0 else np.float64
        r = comm.iallreduce(np.ones(4, dtype), name="mismatch")
        with pytest.raises(shoal.ShoalError) as info:
            r.wait(timeout_s=10)
        shape = comm.iallreduce(np.ones(4 + comm.rank, np.float32), name="shape")
        with pytest.raises(shoal.ShoalError) as info2:
            shape.wait(timeout_s=10)
        return info.value.status_name, info.value.message, info2.value.status_name

    for status, message, status2 in run_threads(2, body):
        assert status == "SHOAL_ERR_MISMATCH" and "mismatch" in message
        assert status2 == "SHOAL_ERR_MISMATCH"


def test_wait_timeout_leaves_request_pending():
    def body(comm):
        comm.async_start()  # collective: starting the runtime waits for every rank
        if comm.rank == 0:
            r = comm.iallreduce(np.ones(2, np.float32), name="late")
            with pytest.raises(shoal.ShoalError) as info:
                r.wait(timeout_s=0.2)
            assert info.value.status_name == "SHOAL_ERR_TIMEOUT"
            assert not r.test()
            with pytest.raises(shoal.ShoalError) as info_all:
                shoal.wait_all([r], timeout_s=0.1)
            assert info_all.value.status_name == "SHOAL_ERR_TIMEOUT" and not r.done
            comm.barrier()
            return r.wait(timeout_s=10)
        time.sleep(0.6)
        r = comm.iallreduce(np.ones(2, np.float32), name="late")
        comm.barrier()
        return r.wait(timeout_s=10)

    for out in run_threads(2, body):
        assert np.array_equal(out, [2, 2])


@pytest.mark.parametrize("compressor,options", [("fp16", None), ("bf16", None), ("topk", {"ratio": 1.0}),
                                                ("powersgd", "rank=8"), ("sketch", None)])
def test_compressors_per_call_and_stats(compressor, options):
    def body(comm):
        x = np.zeros((8, 8), np.float32)
        x[comm.rank, :] = np.arange(8)          # exact in every compressor (low rank, sparse, small ints)
        y = comm.allreduce(x, name="w", compressor=compressor, compressor_options=options, compress_min_bytes=0)
        return y, comm.last_compress_stats()

    want = np.zeros((8, 8), np.float32)
    want[0, :] = want[1, :] = np.arange(8)
    for y, stats in run_threads(2, body):
        assert stats["compressor"] == compressor and stats["input_bytes"] == 256 and stats["rounds"] >= 1
        assert np.allclose(y, want, atol=1e-3), (compressor, y)


def test_compressor_state_save_and_load():
    def body(comm):
        x = np.arange(16, dtype=np.float32)
        comm.allreduce(x, name="ef", compressor="topk", compressor_options="k=2", compress_min_bytes=0)
        state = comm.compressor_state_save("topk", "ef", compressor_options="k=2")
        comm.compressor_state_load("topk", "ef", state, compressor_options="k=2")
        assert comm.compressor_state_save("topk", "never-seen", compressor_options="k=2") is None
        return state

    for state in run_threads(2, body):
        assert isinstance(state, bytes) and len(state) > 0


def test_lowrank_plan_factorize_fused_allreduce():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    u, v, s = shoal.factorize(w, 4)
    assert u.shape == (6, 4) and v.shape == (4, 4) and s.shape == (4,)
    assert np.allclose(u @ v.T, w, atol=1e-4)
    u2, v2, _ = shoal.factorize(w, 2)
    assert np.isclose(np.linalg.norm(w - u2 @ v2.T), np.sqrt((s[2:] ** 2).sum()), rtol=1e-3)
    assert shoal.rank_for(64, 32, 4) == 8 and shoal.rank_for(3, 3, 4) == 1
    with pytest.raises(ValueError):
        shoal.rank_for(0, 3)
    with pytest.raises(shoal.ShoalError, match="rank"):
        shoal.factorize(w, 5)
    with pytest.raises(TypeError):
        shoal.factorize(w.astype(np.float64), 2)

    def body(comm):
        a, b = np.full(3, comm.rank + 1.0, np.float32), np.full((2, 2), comm.rank * 2.0, np.float32)
        comm.fused_allreduce([a, b], op="sum")
        # rank == min(rows, cols): PowerSGD is exact (up to rounding).
        plan = shoal.LowRankPlan([(4, 3, "m0"), (5, 1, "bias")], rank=3)
        g0 = (np.arange(12, dtype=np.float32).reshape(4, 3) + comm.rank)
        g1 = np.full(5, comm.rank, np.float32)
        plan.step(comm, [g0, g1], op="avg")
        state = plan.state_save()
        plan.state_load(state)
        return a, b, g0, g1, plan.sizes

    for a, b, g0, g1, sizes in run_threads(2, body):
        assert np.array_equal(a, [3, 3, 3]) and np.array_equal(b, np.full((2, 2), 2))
        assert np.allclose(g0, np.arange(12).reshape(4, 3) + 0.5, atol=1e-4)
        assert np.allclose(g1, 0.5)
        assert sizes["compressed"] == 0 or sizes["p_elems"] > 0


def test_finalized_communicator_raises():
    def body(comm):
        comm.barrier()
        return comm

    comms = run_threads(1, body)
    with pytest.raises(shoal.ShoalError, match="finalized"):
        comms[0].allreduce(np.ones(2))


def test_default_communicator_functions():
    assert not shoal.is_initialized()
    with pytest.raises(shoal.ShoalError, match="init"):
        shoal.rank()
    shoal.init(rank=0, world_size=1, store="memory://default-test")
    try:
        assert shoal.rank() == 0 and shoal.size() == 1 and shoal.local_size() >= 1
        assert np.array_equal(shoal.allreduce(np.arange(3)), np.arange(3))
        assert np.array_equal(shoal.iallreduce(np.arange(3), name="x").wait(), np.arange(3))
    finally:
        shoal.finalize()
    assert not shoal.is_initialized()


def test_lowrank_split_phases_equal_step():
    """phase_p / phase_q / finish around the caller's own SUM allreduces give the bits step() gives."""
    def body(comm):
        rng = np.random.default_rng(comm.rank)
        grads = [rng.standard_normal((16, 12)).astype(np.float32), rng.standard_normal(7).astype(np.float32)]
        specs = [(16, 12, "w"), {"rows": 7, "cols": 1, "name": "b", "dense": True}]
        stepped = [g.copy() for g in grads]
        shoal.LowRankPlan(specs, rank=2).step(comm, stepped, op="avg")
        plan = shoal.LowRankPlan(specs, rank=2)
        p_buf, p_count = plan.phase_p(grads)
        comm.allreduce(p_buf[:p_count], out=p_buf[:p_count], op="sum")
        q_buf, q_count = plan.phase_q()
        if q_count:
            comm.allreduce(q_buf[:q_count], out=q_buf[:q_count], op="sum")
        outputs = [np.empty_like(g) for g in grads]
        plan.finish(outputs, comm.size, op="avg")
        assert plan.sizes["compressed"] == 1 and q_count > 0
        return stepped, outputs

    for stepped, outputs in run_threads(2, body):
        for a, b in zip(stepped, outputs):
            assert np.array_equal(a, b)
