"""Horovod process sets on shoal.torch (hvd.ProcessSet, add_process_set, process_set=), against exact
values. Run under shoalrun -np 4; exits non-zero on any mismatch."""
import torch

import shoal.torch as hvd

torch.set_num_threads(1)
evens = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[evens])
R, N = hvd.rank(), hvd.size()
assert N == 4, N
odds = hvd.add_process_set([3, 1])
assert odds.ranks == [1, 3] and odds.process_set_id != evens.process_set_id
mine, other = (evens, odds) if R % 2 == 0 else (odds, evens)
assert mine.included() and not other.included()
assert mine.size() == 2 and mine.rank() == mine.ranks.index(R)

x = torch.tensor([float(R + 1)] * 3)
assert torch.equal(hvd.allreduce(x, op=hvd.Sum, process_set=mine), torch.tensor([float(sum(r + 1 for r in mine.ranks))] * 3))
assert torch.equal(hvd.allreduce(x, process_set=mine), torch.tensor([sum(r + 1 for r in mine.ranks) / 2.0] * 3))
y = x.clone()
hvd.allreduce_(y, op=hvd.Sum, process_set=hvd.global_process_set)
assert torch.equal(y, torch.tensor([10.0] * 3)), y
g = hvd.allgather(torch.tensor([[R, R]]), process_set=mine)
assert torch.equal(g, torch.tensor([[r, r] for r in mine.ranks])), g
root = mine.ranks[-1]  # a global rank, as Horovod's process set ranks are
b = hvd.broadcast(torch.tensor([R * 100]), root_rank=root, process_set=mine)
assert int(b[0]) == root * 100, b
rs = hvd.reducescatter(torch.arange(4, dtype=torch.float32) * (R + 1), op=hvd.Sum, process_set=mine)
scale = sum(r + 1 for r in mine.ranks)
start = 2 * mine.rank()
assert torch.equal(rs, torch.arange(start, start + 2, dtype=torch.float32) * scale), rs
grads = hvd.grouped_allreduce([torch.ones(2) * R, torch.ones(1)], op=hvd.Sum, process_set=mine)
assert torch.equal(grads[0], torch.ones(2) * sum(mine.ranks)) and torch.equal(grads[1], torch.ones(1) * 2)
hvd.barrier(process_set=mine)
try:
    hvd.allreduce(x, process_set=other)
    raise AssertionError("an allreduce on a set without this rank must raise")
except ValueError as error:
    assert "not in process set" in str(error), error
# A differentiable allreduce inside the set: the gradient is reduced over the set too.
w = torch.ones(2, requires_grad=True)
hvd.allreduce(w * (R + 1), op=hvd.Sum, process_set=mine).sum().backward()
assert torch.equal(w.grad, torch.ones(2) * 2 * (R + 1)), w.grad
assert hvd.remove_process_set(odds)
hvd.shutdown()
print("torch_process_sets OK on %d ranks" % N)
