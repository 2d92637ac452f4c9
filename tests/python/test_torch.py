"""shoal.torch, the Horovod drop-in: multi-process runs under shoalrun (skipped only without torch)."""
import pytest

from conftest import shoalrun, torch_or_skip


@pytest.mark.parametrize("nranks", [2, 4])
def test_every_operation_and_dtype(nranks):
    torch_or_skip()
    rc, out = shoalrun(nranks, "torch_ops.py", timeout_s=240)
    assert rc == 0, out
    assert out.count("torch_ops OK on %d ranks" % nranks) == nranks, out


def test_horovod_training_loop_with_every_compressor():
    torch_or_skip()
    # Horovod compresses every tensor; shoal skips those under SHOAL_COMPRESS_MIN_BYTES (64 KiB by
    # default), which would leave this small model uncompressed.
    rc, out = shoalrun(2, "torch_train.py", timeout_s=240, env={"SHOAL_COMPRESS_MIN_BYTES": "0"})
    assert rc == 0, out
    assert out.count("torch_train OK on 2 ranks") == 2, out
    for name in ("fp16", "bf16", "topk", "powersgd", "sketch"):
        assert name in out, out


def test_single_process_api():
    torch = torch_or_skip()
    import shoal
    import shoal.torch as hvd
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.rank()
    shoal.init(rank=0, world_size=1, store="memory://torch-single")
    try:
        assert hvd.is_initialized() and hvd.size() == 1
        x = torch.arange(4, dtype=torch.float32)
        assert torch.equal(hvd.allreduce(x), x)
        with pytest.raises(TypeError, match="CPU"):
            hvd.allreduce(torch.zeros(2, device="meta"))
        with pytest.raises(NotImplementedError, match="comm="):
            hvd.init(comm=object())
        with pytest.raises(ValueError, match="unknown or was already synchronized"):
            hvd.synchronize(10 ** 9)
        c = hvd.Compression.powersgd(rank=2, start_iter=5)
        assert c.shoal_compressor(x) == ("powersgd", "rank=2,start_iter=5,ef=1")
        assert c.shoal_compressor(x.int()) == ("none", None)
        assert hvd.Compression.topk(k=3).shoal_compressor(x) == ("topk", "k=3,ef=1")
        assert hvd.Compression.sketch(exact=False).shoal_compressor(x) == ("sketch", "exact=0")  # docs/python.md
        assert hvd.Compression.fp16.compress(x) == (x, None)
    finally:
        hvd.shutdown()


def test_ddp_comm_hook(tmp_path):
    torch_or_skip()
    rc, out = shoalrun(2, "torch_ddp.py", tmp_path / "gloo-rendezvous", timeout_s=240,
                       env={"SHOAL_COMPRESS_MIN_BYTES": "0"})
    assert rc == 0, out
    assert out.count("torch_ddp OK on 2 ranks") == 2, out


def test_pufferfish_factorize_model():
    torch_or_skip()
    rc, out = shoalrun(2, "torch_pufferfish.py", timeout_s=240)
    assert rc == 0, out
    assert out.count("torch_pufferfish OK on 2 ranks") == 2, out
