"""DDP with shoal's comm hook equals plain DDP (Compression.none); with powersgd the ranks stay
identical, the loss falls and the hook state round-trips through state_dict.
argv[1]: a file path for the gloo process group's rendezvous."""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shoal.torch as hvd
import shoal.torch.ddp as shoal_ddp

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=R, world_size=N)


def make():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def run(compression=None, steps=8):
    model = make()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = None
    if compression is not None:
        state = shoal_ddp.State(model, dense_steps=2)
        ddp.register_comm_hook(state, shoal_ddp.hook(compression))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step * N + R)
        x = torch.randn(8, 16, generator=g)
        y = x[:, :3].argmax(1)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(hvd.allreduce(loss.detach(), name="ddp.loss")))
    return model, losses, state


def spread(model):
    return max((hvd.allreduce(p.detach(), op=hvd.Max) - hvd.allreduce(p.detach(), op=hvd.Min)).abs().max().item()
               for p in model.parameters())


plain, _, _ = run()
hooked, _, _ = run(hvd.Compression.none)
gap = max((p - q).abs().max().item() for p, q in zip(plain.parameters(), hooked.parameters()))
assert gap < 1e-6, "shoal hook differs from plain DDP by %g" % gap
model, losses, state = run(hvd.Compression.powersgd(rank=1), steps=10)
assert spread(model) == 0.0 and losses[-1] < losses[0], losses
assert state.step == 10
saved = state.state_dict()
assert saved["step"] == 10 and any(k.startswith("ddp.") for k in saved["compressor_state"]), saved.keys()
shoal_ddp.State(model).load_state_dict(saved)
dist.barrier()
print("torch_ddp OK on", N, "ranks")
dist.destroy_process_group()
hvd.shutdown()
