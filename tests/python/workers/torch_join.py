"""Horovod's join with uneven data: rank r has 2 + 2r batches; after its last one it calls
hvd.join() and stands in with zeros for the others' gradient allreduces, so the loop finishes
without a hang. The parameters (broadcast from the last rank to join, as Horovod's docs advise)
must equal a one-process replay in which each step averages the gradients of the ranks that still
had a batch over size(). Mode "refuse": an allgather while a rank has joined fails on every rank."""
import sys

import torch
import torch.nn.functional as F

import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
BATCH = 8


def batches(rank):
    return 2 + 2 * rank


def data(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(BATCH, 6, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long()


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()


def replay():
    model = make_model()
    for step in range(max(batches(r) for r in range(N))):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(N):
            if step >= batches(r):
                continue  # joined: contributes zeros
            model.zero_grad()
            x, y = data(r, step)
            F.cross_entropy(model(x), y).backward()
            for g, p in zip(grads, model.parameters()):
                g += p.grad
        with torch.no_grad():
            for g, p in zip(grads, model.parameters()):
                p -= 0.1 * g / N  # Average divides by size(), joined ranks included
    return model


def train():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(batches(R)):
        x, y = data(R, step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        hvd.allreduce(loss.detach(), name="loss")  # a metric, averaged with the joined ranks' zeros
    last = hvd.join()
    assert last == N - 1, "join returned %d, expected the rank with the most batches, %d" % (last, N - 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    expected = replay()
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-12), "%s differs from the replay by %g" % (
            name, (p - q).abs().max().item())
    # A second epoch, every rank with the same data: join again, now everyone at once.
    x, y = data(R, 0)
    total = hvd.allreduce(torch.full((3,), float(R + 1)), name="epoch2", op=hvd.Sum)
    assert total.tolist() == [N * (N + 1) / 2] * 3, total
    assert hvd.join() in range(N)


def refuse():
    if R == 0:
        try:
            hvd.join()
        except hvd.HorovodInternalError as error:
            assert "while this rank was joined" in str(error) and "'gathered.shape'" in str(error), str(error)
        else:
            raise AssertionError("join did not report the refused allgather")
        return
    try:
        hvd.allgather(torch.ones(2, 3), name="gathered")
    except hvd.HorovodInternalError as error:
        assert "called shoal_join" in str(error) and "allgather" in str(error), str(error)
    else:
        raise AssertionError("allgather with a joined rank did not fail")
    total = hvd.allreduce(torch.ones(4), name="still_summed", op=hvd.Sum)
    assert total.tolist() == [1.0] * 4, total  # rank 0's zeros
    assert hvd.join() == N - 1


mode = sys.argv[1] if len(sys.argv) > 1 else "train"
train() if mode == "train" else refuse()
print("torch_join %s OK on rank %d of %d" % (mode, R, N), flush=True)
hvd.shutdown()
