"""A Horovod-style training loop, unchanged but for its import line, with every compressor.

Each rank trains on its own shard; with Compression.none the parameters must equal
a single-process run on the whole batch (the averaged gradient), on every rank.
Lossless sketch must match none as closely; lossy compressors must keep the ranks
identical and reduce the loss. Also DistributedOptimizer's error paths."""
import warnings

import torch
import torch.nn.functional as F

import shoal
import shoal.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
STEPS = 12
BATCH = 16


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def data(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH * N, 20, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 1).long()) % 4
    return x, y


def reference():
    """One process, whole batch: what data-parallel averaging must reproduce."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train(compression, backward_passes_per_step=1, groups=None):
    model = make_model()
    with torch.no_grad():  # different starting points on each rank: broadcast_parameters must fix that
        for p in model.parameters():
            p.add_(R)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression,
                                   backward_passes_per_step=backward_passes_per_step, groups=groups)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        shard = slice(R * BATCH, (R + 1) * BATCH)
        opt.zero_grad()
        if backward_passes_per_step == 1:
            loss = F.cross_entropy(model(x[shard]), y[shard])
            loss.backward()
        else:  # two half batches accumulated locally
            half = BATCH // 2
            for k in range(2):
                part = slice(R * BATCH + k * half, R * BATCH + (k + 1) * half)
                loss = F.cross_entropy(model(x[part]), y[part]) / 2
                loss.backward()
        opt.step()
        compressed_by = shoal.last_compress_stats()["compressor"]
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    return model, losses, compressed_by


def max_rank_difference(model):
    return max((hvd.allreduce(p.detach(), op=hvd.Max) - hvd.allreduce(p.detach(), op=hvd.Min)).abs().max().item()
               for p in model.parameters())


def distance(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


ref = reference()
none_model, none_losses, _ = train(hvd.Compression.none)
assert max_rank_difference(none_model) == 0.0
assert distance(none_model, ref) < 1e-5, distance(none_model, ref)

cases = {"fp16": hvd.Compression.fp16, "bf16": hvd.Compression.bf16, "topk": hvd.Compression.topk(ratio=0.3),
         "powersgd": hvd.Compression.powersgd(rank=2, start_iter=2), "sketch": hvd.Compression.sketch()}
for name, compression in cases.items():
    model, losses, compressed_by = train(compression)
    assert compressed_by == name, "%s: the last step ran %s" % (name, compressed_by)
    spread = max_rank_difference(model)
    assert spread == 0.0, "%s: ranks differ by %g" % (name, spread)
    assert losses[-1] < losses[0], "%s: loss went from %g to %g" % (name, losses[0], losses[-1])
    gap = distance(model, ref)
    limit = {"sketch": 1e-5, "fp16": 1e-3, "bf16": 2e-2}.get(name, 0.2)
    assert gap < limit, "%s: %g from the reference" % (name, gap)
    if R == 0:
        print("%-9s loss %.4f -> %.4f, max |w - w_ref| %.2e" % (name, losses[0], losses[-1], gap))

# gradient accumulation and explicit groups give the same result as plain none
acc_model, _, _ = train(hvd.Compression.none, backward_passes_per_step=2)
assert distance(acc_model, ref) < 1e-5, distance(acc_model, ref)
grp_model, _, _ = train(hvd.Compression.none, groups=2)
assert distance(grp_model, ref) < 1e-5, distance(grp_model, ref)

# synchronize + skip_synchronize (gradient clipping), and its warning without the context
model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
x, y = data(0)
F.cross_entropy(model(x), y).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
opt.zero_grad()
F.cross_entropy(model(x), y).backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
assert any("skip_synchronize" in str(w.message) for w in caught)

# Horovod's errors
opt.zero_grad()
F.cross_entropy(model(x), y).backward()
try:
    opt.zero_grad()
    raise AssertionError("zero_grad before synchronize was accepted")
except AssertionError as error:
    assert "zero_grad() was called after loss.backward()" in str(error), error
opt.synchronize()
m = make_model()
params = list(m.named_parameters())
for bad, text in (([(params[0][0], params[0][1]), (params[0][0], params[1][1])], "duplicates"),
                  (params[:1], "not named"), ([p for _, p in params], "tuples")):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=bad)
        raise AssertionError("accepted bad named_parameters: " + text)
    except ValueError as error:
        assert text in str(error), error
for kwargs in ({"backward_passes_per_step": 0}, {"op": hvd.Sum, "gradient_predivide_factor": 2.0}):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=params, **kwargs)
        raise AssertionError("accepted %s" % kwargs)
    except ValueError:
        pass
hvd.barrier()
print("torch_train OK on", N, "ranks")
hvd.shutdown()
