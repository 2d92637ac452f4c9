"""An MLP 64-1024-1024-10 (1.13 M parameters, dense gradients) on scikit-learn's digits.

    shoalrun -np 2 python3 examples/train/digits_mlp.py --compression powersgd --epochs 10

Prints per-epoch loss and test accuracy and, last on rank 0, `accuracy=<x>`. Options: --help;
backends and sharding: common.py.
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def mlp():
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def train(args, dist, x_train, y_train, x_test, y_test):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = dist.wrap(model, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    record = common.Recorder(args, dist, "accuracy")

    for epoch in range(1, args.epochs + 1):
        losses = []
        for idx in common.shard(len(y_train), epoch, args.seed, dist.rank, dist.size, args.batch_size,
                                args.max_steps):
            def step():
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                return loss.item()
            losses.append(record.timed_step(step))
        record.epoch(epoch, losses, {"accuracy": common.classify(model, x_test, y_test)})

    record.finish(model, record.epochs[-1]["accuracy"])


def main():
    args = common.parser(__doc__.splitlines()[0], epochs=10, batch_size=32, lr=0.05).parse_args()
    common.setup(args)
    dist = common.Dist(args)
    data = common.digits(args.train_subset)
    common.each_compression(args, dist, lambda: train(args, dist, *data))
    dist.finish()


if __name__ == "__main__":
    main()
