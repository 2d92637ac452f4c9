"""shoal.torch.pufferfish under shoalrun: the factor layers are the truncated SVD of the weight,
identical on every rank (rank 0's SVD), and their gradients average in one fused call."""
import torch

import shoal.torch as hvd
from shoal.torch import pufferfish

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv = torch.nn.Conv2d(8, 32, 3, padding=1)
        self.conv1d = torch.nn.Conv1d(32, 32, 3, padding=1)
        self.hidden = torch.nn.Linear(32 * 16, 64)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv(torch.relu(self.stem(x))))          # [b, 32, 4, 4]
        x = torch.relu(self.conv1d(x.flatten(2)))                     # [b, 32, 16]
        return self.fc(torch.relu(self.hidden(x.flatten(1))))


torch.manual_seed(R)  # a different model on every rank: factorize_model must make them equal
model = Net()
x = torch.randn(5, 3, 4, 4)

small, names = pufferfish.factorize_model(model, rank_factor=4, skip=("stem", "fc"))
assert set(names) == {"conv", "conv1d", "hidden"}, names
assert isinstance(small.stem, torch.nn.Conv2d) and isinstance(small.fc, torch.nn.Linear)
assert small.conv[0].weight.shape == (8, 8, 3, 3) and small.conv[1].weight.shape == (32, 8, 1, 1)
assert small.hidden[0].weight.shape == (16, 512) and small.hidden[1].weight.shape == (64, 16)
assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())

# every rank holds rank 0's factors
for name, p in small.named_parameters():
    if name.split(".")[0] in names:
        spread = (hvd.allreduce(p.detach(), op=hvd.Max) - hvd.allreduce(p.detach(), op=hvd.Min)).abs().max()
        assert spread.item() == 0.0, name

# the factors are the truncated SVD: on rank 0's weight, U'V'^T is its best rank-r approximation
if R == 0:
    w = model.hidden.weight.detach()
    approx = small.hidden[1].weight.detach() @ small.hidden[0].weight.detach()
    s = torch.linalg.svdvals(w)
    err = torch.linalg.norm(w - approx)
    assert abs(err - torch.sqrt((s[16:] ** 2).sum())) < 1e-3 * torch.linalg.norm(w), err

# fused gradient averaging
small.zero_grad()
small(x * (R + 1)).sum().backward()
local = [p.grad.clone() for p in small.parameters()]
pufferfish.allreduce_gradients(small)
for p, g in zip(small.parameters(), local):
    want = hvd.allreduce(g, op=hvd.Average)
    assert torch.allclose(p.grad, want, atol=1e-6), (p.shape, (p.grad - want).abs().max())
assert pufferfish.switch_epoch(300, 80 / 300) == 80
hvd.barrier()
print("torch_pufferfish OK on", N, "ranks")
hvd.shutdown()
