"""Horovod scripts as a demanding user writes them, on 2 ranks, against exact references.

Each case is a function; `torch_compat.py [case ...]` runs the named ones (default: all), in
order, and prints "torch_compat <case> OK" for each. A failing case prints its traceback and
ends the process at once (os._exit), so that the other rank cannot hang on a collective the
failing one will never make: shoalrun then ends the job. Every reference is computed in float64
by one process replaying what data-parallel Horovod does (each rank's gradient, averaged)."""
import os
import sys
import traceback
import warnings

import torch
import torch.nn.functional as F

import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
assert N == 2, "torch_compat runs on 2 ranks"


def batch(rank, step, rows=4, cols=6):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long()


def mlp():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()


_checks = iter(range(10 ** 9))


def same_on_every_rank(tensor, what):
    every = hvd.allgather(tensor.detach().reshape(1, -1).contiguous(), name="same.%d.%s" % (next(_checks), what))
    assert torch.equal(every[0], every[1]), "%s differs between ranks: %s" % (what, every)


def close(a, b, what, tol=1e-12):
    assert a.shape == b.shape and a.dtype == b.dtype, "%s: %s %s vs %s %s" % (what, a.shape, a.dtype, b.shape,
                                                                              b.dtype)
    assert torch.allclose(a, b, rtol=tol, atol=tol), "%s: %s vs reference %s" % (what, a, b)


def avg_grads(model_fn, loss_fn, ranks=range(N)):
    """The gradients Horovod's DistributedOptimizer applies: each rank's, averaged over size()."""
    grads = None
    for r in ranks:
        model = model_fn()
        loss_fn(model, r).backward()
        g = [torch.zeros_like(p) if p.grad is None else p.grad.to_dense() for p in model.parameters()]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    return [g / N for g in grads]


# ---- collectives the way Horovod's examples use them ----------------------------------------------
def case_collectives():
    # metric_average (pytorch_mnist.py): a Python float as a 0-d tensor, then .item()
    avg = hvd.allreduce(torch.tensor(1.5 * (R + 1)), name="avg_loss")
    assert avg.dim() == 0 and avg.dtype == torch.float32 and avg.item() == 2.25, avg
    # resume_from_epoch (pytorch_imagenet_resnet50.py): a 0-d int64 broadcast, then .item()
    epoch = hvd.broadcast(torch.tensor(7 if R == 0 else 0), root_rank=0, name="resume_from_epoch").item()
    assert epoch == 7, epoch
    # int tensors with op=Sum stay ints and are exact; float with the default Average
    for dtype in (torch.int32, torch.int64):
        s = hvd.allreduce(torch.tensor([R + 1, 10 * (R + 1)], dtype=dtype), op=hvd.Sum)
        assert s.dtype == dtype and s.tolist() == [3, 30], s
    a = hvd.allreduce(torch.tensor([1.0, 2.0], dtype=torch.float64) * (R + 1))
    assert a.tolist() == [1.5, 3.0], a
    # allgather: the first dim differs per rank; rows in rank order; the gradient is this rank's rows
    x = (torch.arange((R + 1) * 3, dtype=torch.float64).reshape(R + 1, 3) + 100 * R).requires_grad_()
    g = hvd.allgather(x, name="uneven")
    assert g.shape == (3, 3) and g[0].tolist() == [0, 1, 2] and g[1].tolist() == [100, 101, 102], g
    (g * torch.arange(1, 4, dtype=torch.float64).reshape(3, 1)).sum().backward()
    assert x.grad.tolist() == [[1] * 3] if R == 0 else x.grad.tolist() == [[2] * 3, [3] * 3], x.grad
    ints = hvd.allgather(torch.full((R + 2,), R, dtype=torch.int32))
    assert ints.tolist() == [0, 0, 1, 1, 1], ints
    none_here = hvd.allgather(torch.ones(R, 2))  # rank 0 has no rows
    assert none_here.shape == (1, 2) and none_here.tolist() == [[1.0, 1.0]], none_here
    # broadcast_object of a dict from a non-zero root
    obj = {"epoch": 3, "rank": R, "t": torch.arange(3) + R}
    got = hvd.broadcast_object(obj, root_rank=1)
    assert got["rank"] == 1 and got["t"].tolist() == [1, 2, 3], got
    assert hvd.allgather_object({"r": R}) == [{"r": 0}, {"r": 1}]


def case_broadcast_object_root_keeps_its_object():
    # Horovod returns the root's own object (only the other ranks unpickle a copy).
    obj = {"layers": [1, 2]}
    got = hvd.broadcast_object(obj, root_rank=0, name="root_identity")
    if R == 0:
        assert got is obj, "broadcast_object returned a copy on the root"
    else:
        assert got == obj


# ---- DistributedOptimizer ---------------------------------------------------------------------------
def case_accumulate_and_clip():
    """backward_passes_per_step=2 (zero_grad, 2 backwards, step), then the clipping pattern:
    synchronize(), clip_grad_norm_, step() inside skip_synchronize() (no warning)."""
    def loss(model, r, step, half):
        x, y = batch(r, step, rows=8)
        x, y = x[4 * half:4 * half + 4], y[4 * half:4 * half + 4]
        return F.cross_entropy(model(x), y)

    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    for step in range(3):
        opt.zero_grad()
        loss(model, R, step, 0).backward()
        loss(model, R, step, 1).backward()
        if step < 2:
            opt.step()
        else:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with opt.skip_synchronize():
                    opt.step()
        # reference: each rank's two passes accumulate locally, then the ranks average
        ref_opt.zero_grad()
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(N):
            for half in (0, 1):
                for p in ref.parameters():
                    p.grad = None
                loss(ref, r, step, half).backward()
                grads = [a + p.grad for a, p in zip(grads, ref.parameters())]
        for p, g in zip(ref.parameters(), grads):
            p.grad = g / N
        if step == 2:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), name)


def case_optimizer_state_broadcast():
    """pytorch_imagenet_resnet50.py's resume: rank 0 loads a checkpoint into its (wrapped)
    optimizer, then broadcast_parameters and broadcast_optimizer_state; rank 1 is fresh (its
    state not yet created, Adam's and SGD's alike) and has another lr. Both fresh, the
    pytorch_mnist.py order (broadcast, then wrap)."""
    for make in (lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
                 lambda ps, lr: torch.optim.Adam(ps, lr=lr)):
        model = mlp()
        if R == 0:
            trained = make(model.parameters(), 0.1)
            x, y = batch(0, 0)
            F.cross_entropy(model(x), y).backward()
            trained.step()
            checkpoint = trained.state_dict()
        opt = hvd.DistributedOptimizer(make(model.parameters(), 0.7), named_parameters=model.named_parameters())
        if R == 0:
            opt.load_state_dict(checkpoint)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["lr"] == 0.1, opt.param_groups[0]["lr"]
        state = opt.state_dict()["state"]
        assert sorted(state) == list(range(4)), sorted(state)
        for i in sorted(state):
            for key, value in sorted(state[i].items()):
                if torch.is_tensor(value):
                    same_on_every_rank(value.double(), "state.%d.%s" % (i, key))
        for step in range(2):
            x, y = batch(R, step + 1)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        for name, p in model.named_parameters():
            same_on_every_rank(p, name)
        # both fresh, broadcast before wrapping (pytorch_mnist.py)
        model = mlp()
        opt = make(model.parameters(), 0.1 * (R + 1))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["lr"] == 0.1, opt.param_groups[0]["lr"]
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        for step in range(2):
            x, y = batch(R, step + 1)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        for name, p in model.named_parameters():
            same_on_every_rank(p, name)


def case_unused_and_frozen_parameters():
    """A parameter only rank 0 uses (its gradient is None on rank 1), one nobody uses, and a
    frozen one (requires_grad=False): Horovod averages the first with rank 1's zeros, gives the
    unused one a zero gradient, and never touches the frozen one."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(11)
            self.a = torch.nn.Linear(6, 2).double()
            self.only_rank0 = torch.nn.Linear(6, 2).double()
            self.never = torch.nn.Linear(6, 2).double()
            self.frozen = torch.nn.Linear(6, 2).double()
            self.frozen.weight.requires_grad_(False)

        def forward(self, x, r):
            out = self.a(x) + self.frozen(x)
            return out + self.only_rank0(x) if r == 0 else out

    def loss(model, r):
        x, y = batch(r, 0)
        return F.cross_entropy(model(x, r), y)

    model = Net()
    frozen_before = model.frozen.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    loss(model, R).backward()
    opt.step()
    grads = avg_grads(Net, loss)
    ref = Net()
    with torch.no_grad():
        for p, g in zip(ref.parameters(), grads):
            if p.requires_grad:
                p -= 0.3 * g
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), name)
    assert torch.equal(model.frozen.weight, frozen_before)
    assert model.frozen.weight.grad is None
    assert torch.equal(model.never.weight.grad, torch.zeros_like(model.never.weight))


def _embedding_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Flatten(),
                               torch.nn.Linear(6, 2)).double()


def _embedding_loss(model, r, step=0):
    ids = torch.tensor([[r, 2 * r + 1], [5, r + step]])  # rows overlap between ranks and within one
    return model(ids).pow(2).sum() * (r + 1)


def case_sparse_gradients():
    """nn.Embedding(sparse=True): Horovod allgathers the sparse gradients (sparse_as_dense=False,
    the default) or allreduces them densely and hands the optimizer a sparse gradient again
    (sparse_as_dense=True, which SparseAdam needs). Both must equal the averaged gradients."""
    for sparse_as_dense in (False, True):
        model = _embedding_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                       named_parameters=model.named_parameters(), sparse_as_dense=sparse_as_dense)
        ref = _embedding_model()
        for step in range(2):
            opt.zero_grad()
            _embedding_loss(model, R, step).backward()
            opt.synchronize()
            grad = model[0].weight.grad
            assert grad.is_sparse, "sparse_as_dense=%s: the embedding's gradient is no longer sparse" % sparse_as_dense
            expected = avg_grads(_embedding_model if step == 0 else (lambda: ref_copy(ref)),
                                 lambda m, r: _embedding_loss(m, r, step))
            close(grad.to_dense(), expected[0], "embedding grad (sparse_as_dense=%s)" % sparse_as_dense)
            close(model[2].weight.grad, expected[1], "linear grad")
            with opt.skip_synchronize():
                opt.step()
            with torch.no_grad():
                for p, g in zip(ref.parameters(), expected):
                    p -= 0.2 * g
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                close(p.detach(), q.detach(), name)
    # SparseAdam takes sparse gradients only: sparse_as_dense must give it sparse ones again
    emb = _embedding_model()[0]
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(), sparse_as_dense=True)
    opt.zero_grad()
    emb(torch.tensor([R, 4])).sum().backward()
    opt.step()
    same_on_every_rank(emb.weight, "sparse_adam.weight")


def ref_copy(model):
    copy = _embedding_model()
    copy.load_state_dict(model.state_dict())
    return copy


# ---- Horovod's Compressor interface, implemented by the user ------------------------------------------
class HalfInPython(hvd.Compressor):
    """A user's compressor as Horovod documents them: compress() before, decompress() after."""
    calls = []

    @staticmethod
    def compress(tensor):
        HalfInPython.calls.append("compress")
        return tensor.to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        HalfInPython.calls.append("decompress")
        return tensor.to(ctx)


class Scale2:
    """One that does not even subclass Compressor (duck-typed, as Horovod accepts)."""

    @staticmethod
    def compress(tensor):
        return tensor * 2, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor / 2


def case_user_compressor():
    x = torch.tensor([1.0, 2.0, 3.0]) * (R + 1)
    y = hvd.allreduce(x, compression=HalfInPython)
    assert y.dtype == torch.float32 and y.tolist() == [1.5, 3.0, 4.5], y
    assert HalfInPython.calls == ["compress", "decompress"], HalfInPython.calls
    assert hvd.allreduce(x, op=hvd.Sum, compression=Scale2).tolist() == [3.0, 6.0, 9.0]
    for compression in (HalfInPython, Scale2):
        model = mlp()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=compression)
        opt.zero_grad()
        x, yb = batch(R, 0)
        F.cross_entropy(model(x), yb).backward()
        opt.step()
        grads = avg_grads(mlp, lambda m, r: F.cross_entropy(m(batch(r, 0)[0]), batch(r, 0)[1]))
        tol = 1e-3 if compression is HalfInPython else 1e-12
        for (name, p), g in zip(model.named_parameters(), grads):
            assert p.grad.dtype == torch.float64, (name, p.grad.dtype)
            close(p.grad, g, "%s grad with %s" % (name, compression.__name__), tol)


# ---- names a Horovod script may use ------------------------------------------------------------------
def case_more_of_horovods_api():
    # grouped allgather / reducescatter (Horovod >= 0.28), with their gradients
    a = torch.full((R + 1, 2), float(R), dtype=torch.float64, requires_grad=True)
    b = torch.arange(2, dtype=torch.int64) + 10 * R
    ga, gb = hvd.grouped_allgather([a, b], name="ga")
    assert ga.tolist() == [[0, 0], [1, 1], [1, 1]] and gb.tolist() == [0, 1, 10, 11], (ga, gb)
    ga.sum().backward()
    assert a.grad.tolist() == [[1.0, 1.0]] * (R + 1), a.grad
    handle = hvd.grouped_allgather_async([b], name="ga_async")
    assert [t.tolist() for t in hvd.synchronize(handle)] == [[0, 1, 10, 11]]
    c = torch.arange(4, dtype=torch.float64).reshape(4, 1) * (R + 1)
    d = torch.ones(2, 3, dtype=torch.float64) * (R + 1)
    rc, rd = hvd.grouped_reducescatter([c, d], op=hvd.Sum)
    assert rc.tolist() == ([[0.0], [3.0]] if R == 0 else [[6.0], [9.0]]) and rd.tolist() == [[3.0] * 3], (rc, rd)
    rc, = hvd.synchronize(hvd.grouped_reducescatter_async([c], name="grs_async"))
    assert rc.tolist() == ([[0.0], [1.5]] if R == 0 else [[3.0], [4.5]]), rc
    # sparse_allreduce_async returns a callable giving the averaged sparse tensor (Horovod's)
    s = torch.sparse_coo_tensor([[R, 3]], [1.0, 2.0], (4,))
    out = hvd.sparse_allreduce_async(s, name="sparse", op=hvd.Average)()
    assert out.is_sparse and out.to_dense().tolist() == [0.5, 0.5, 0.0, 2.0], out
    # init(process_sets="dynamic") and a second init() are harmless
    hvd.init(process_sets="dynamic")
    # the timeline is SHOAL_TIMELINE's: start_timeline names it instead of failing with AttributeError
    for call in (lambda: hvd.start_timeline("/tmp/unused.json"), hvd.stop_timeline):
        try:
            call()
        except NotImplementedError as error:
            assert "SHOAL_TIMELINE" in str(error), error
        else:
            raise AssertionError("start/stop_timeline without SHOAL_TIMELINE did not say how to get a timeline")


def case_sync_batch_norm():
    """hvd.SyncBatchNorm on CPU tensors: each rank's output, input gradient and running statistics
    equal a BatchNorm over the concatenated batch (loss: the sum of every rank's loss); the weight
    gradients summed over the ranks equal the full batch's."""
    def inputs(r):
        g = torch.Generator().manual_seed(50 + r)
        return torch.randn(3 + r, 4, 5, generator=g, dtype=torch.float64), torch.randn(3 + r, 4, 5, generator=g,
                                                                                      dtype=torch.float64)

    def make(cls):
        torch.manual_seed(2)
        bn = cls(4).double()
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
        return bn

    sync = make(hvd.SyncBatchNorm)
    x, c = inputs(R)
    x.requires_grad_()
    for _ in range(2):
        x.grad = None
        sync.zero_grad()
        y = sync(x)
        (y * c).sum().backward()
    full = make(torch.nn.BatchNorm1d)
    xs, cs = zip(*[inputs(r) for r in range(N)])
    xf = torch.cat(xs).requires_grad_()
    for _ in range(2):
        xf.grad = None
        full.zero_grad()
        yf = full(xf)
        (yf * torch.cat(cs)).sum().backward()
    rows = slice(3 * R + (R * (R - 1)) // 2, 3 * R + (R * (R - 1)) // 2 + 3 + R)
    close(y.detach(), yf.detach()[rows], "output", 1e-10)
    close(x.grad, xf.grad[rows], "input grad", 1e-10)
    close(sync.running_mean, full.running_mean, "running_mean", 1e-10)
    close(sync.running_var, full.running_var, "running_var", 1e-10)
    assert int(sync.num_batches_tracked) == 2
    close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), full.weight.grad, "weight grad", 1e-10)
    close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), full.bias.grad, "bias grad", 1e-10)
    sync.eval()
    close(sync(x.detach()), full.eval()(x.detach()), "eval output", 1e-10)


def case_process_sets():
    """DistributedOptimizer(process_set=hvd.global_process_set) as Horovod's default, spelled out;
    alltoall and broadcast_object over a process set of rank 0 alone (rank 1 makes no call)."""
    model = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=hvd.global_process_set)
    opt.zero_grad()
    x, y = batch(R, 0)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    for name, p in model.named_parameters():
        same_on_every_rank(p, name)
    alone = hvd.add_process_set([0])
    # an optimizer over the set: rank 0 averages over itself alone, rank 1 (outside) keeps its own
    model = mlp()
    ref = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=alone)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for o, m in ((opt, model), (ref_opt, ref)):
        o.zero_grad()
        F.cross_entropy(m(batch(R, 0)[0]), batch(R, 0)[1]).backward()
        o.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), name)
    if R == 0:
        out = hvd.alltoall(torch.arange(3.0), process_set=alone)
        assert out.tolist() == [0.0, 1.0, 2.0], out
        out, received = hvd.alltoall(torch.arange(2.0), splits=[2], process_set=alone)
        assert out.tolist() == [0.0, 1.0] and received.tolist() == [2], (out, received)
        assert hvd.broadcast_object({"a": 1}, root_rank=0, process_set=alone) == {"a": 1}
    hvd.barrier()
    hvd.remove_process_set(alone)


CASES = [name[5:] for name in list(globals()) if name.startswith("case_")]

for case in sys.argv[1:] or CASES:
    try:
        globals()["case_" + case]()
    except BaseException:
        traceback.print_exc()
        print("torch_compat %s FAILED on rank %d" % (case, R), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    hvd.barrier()
    print("torch_compat %s OK" % case, flush=True)
hvd.shutdown()
