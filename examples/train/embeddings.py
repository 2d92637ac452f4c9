"""An NCF-style recommender with sparse gradients: the lossless sketch's case.

    shoalrun -np 2 python3 examples/train/embeddings.py --compression sketch --epochs 2

User and item embeddings (100,000 + 20,000 rows of 32: 3.84 M parameters) and a small MLP
over [u, i, u*i] score a (user, item) pair. The data is generated, no download: user ids are
Zipf-distributed, item popularity too, and each interaction is the item a hidden rank-8 model
prefers among 64 candidates drawn by popularity (Gumbel-max: a softmax choice); one uniform
negative per positive, redrawn every epoch. nn.Embedding(sparse=False) gives dense gradients
that are zero except the rows the batch touched (about 1 % of them).

Test: 1,000 held-out interactions, each ranked against 99 uniform negatives (the NCF
protocol): hit rate at 10 (printed last as `accuracy=`) and AUC.
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def zipf_weights(n, exponent, generator):
    """Zipf weights 1/k^s over n ids, the ids shuffled so popularity is not id order."""
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** exponent
    return weights[torch.randperm(n, generator=generator)]


def generate(args):
    """(train users, train items, test users, test items): implicit feedback from a hidden model.
    Depends only on --data-seed and the sizes, so every --seed trains on the same data."""
    g = torch.Generator().manual_seed(args.data_seed)
    n = args.interactions + args.test
    users = torch.multinomial(zipf_weights(args.users, args.zipf, g), n, replacement=True, generator=g)
    popularity = zipf_weights(args.items, 0.8, g)
    hidden_users = torch.randn(args.users, args.hidden_rank, generator=g)
    hidden_items = torch.randn(args.items, args.hidden_rank, generator=g)
    items = torch.empty(n, dtype=torch.int64)
    chunk = 8192
    for start in range(0, n, chunk):
        u = users[start:start + chunk]
        candidates = torch.multinomial(popularity, len(u) * args.candidates, replacement=True,
                                       generator=g).view(len(u), args.candidates)
        scores = (hidden_users[u].unsqueeze(1) * hidden_items[candidates]).sum(-1) * (2.0 / args.hidden_rank ** 0.5)
        gumbel = -torch.log(-torch.log(torch.rand(scores.shape, generator=g).clamp_min(1e-12)))
        items[start:start + chunk] = candidates.gather(1, (scores + gumbel).argmax(1, keepdim=True)).squeeze(1)
    test_negatives = torch.randint(args.items, (args.test, 99), generator=g)
    return users[:args.interactions], items[:args.interactions], users[args.interactions:], \
        items[args.interactions:], test_negatives


class NCF(nn.Module):
    def __init__(self, users, items, dim):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        self.mlp = nn.Sequential(nn.Linear(3 * dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, u, i):
        eu, ei = self.user(u), self.item(i)
        return self.mlp(torch.cat([eu, ei, eu * ei], dim=-1)).squeeze(-1)


def evaluate(model, test_users, test_items, test_negatives):
    """Hit rate at 10 and AUC of each held-out item against its 99 negatives."""
    model.eval()
    with torch.no_grad():
        candidates = torch.cat([test_items.unsqueeze(1), test_negatives], dim=1)
        scores = model(test_users.unsqueeze(1).expand_as(candidates), candidates)
    model.train()
    above = (scores[:, 1:] > scores[:, :1]).sum(1)
    return {"hit_rate": float((above < 10).double().mean()),
            "auc": float(1.0 - above.double().mean() / 99.0)}


def train(args, dist, train_users, train_items, test_users, test_items, test_negatives):
    torch.manual_seed(args.seed)
    model = NCF(args.users, args.items, args.dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, optimizer = dist.wrap(model, optimizer)
    loss_fn = nn.BCEWithLogitsLoss()
    record = common.Recorder(args, dist, "hit_rate")
    touched = []

    for epoch in range(1, args.epochs + 1):
        # One negative per positive, the same draw on every rank (seeded by --seed and the epoch).
        negatives = torch.randint(args.items, (len(train_users),),
                                  generator=torch.Generator().manual_seed(args.seed * 7919 + epoch))
        losses = []
        for idx in common.shard(len(train_users), epoch, args.seed, dist.rank, dist.size, args.batch_size,
                                args.max_steps):
            u = torch.cat([train_users[idx], train_users[idx]])
            i = torch.cat([train_items[idx], negatives[idx]])
            label = torch.cat([torch.ones(len(idx)), torch.zeros(len(idx))])

            def step():
                optimizer.zero_grad()
                loss = loss_fn(model(u, i), label)
                loss.backward()
                optimizer.step()
                return loss.item()
            losses.append(record.timed_step(step))
            if len(touched) < 20:
                touched.append(len(torch.unique(u)) / args.users)
        record.epoch(epoch, losses, evaluate(model, test_users, test_items, test_negatives))

    final = record.epochs[-1]
    record.extra = {"auc": final["auc"], "user_rows_touched_per_rank": sum(touched) / len(touched),
                    "parameters": sum(p.numel() for p in model.parameters())}
    record.finish(model, final["hit_rate"])


def main():
    p = common.parser(__doc__.splitlines()[0], epochs=3, batch_size=256, lr=0.005)
    p.add_argument("--users", type=int, default=100000)
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--interactions", type=int, default=200000, help="training positives")
    p.add_argument("--test", type=int, default=1000, help="held-out positives")
    p.add_argument("--hidden-rank", type=int, default=8)
    p.add_argument("--candidates", type=int, default=64)
    p.add_argument("--zipf", type=float, default=1.1, help="exponent of the user ids' Zipf law")
    p.add_argument("--data-seed", type=int, default=1)
    args = p.parse_args()
    common.setup(args)
    dist = common.Dist(args)
    train_users, train_items, test_users, test_items, test_negatives = generate(args)
    if args.train_subset:
        train_users, train_items = train_users[:args.train_subset], train_items[:args.train_subset]
    common.each_compression(args, dist, lambda: train(args, dist, train_users, train_items, test_users, test_items,
                                                      test_negatives))
    dist.finish()


if __name__ == "__main__":
    main()
