"""Pufferfish on a small CNN: full rank first, then factorized layers, on digits (8x8) or MNIST-1D.

    shoalrun -np 2 python3 examples/train/pufferfish_cnn.py --epochs 8 --warmup-frac 0.25
    shoalrun -np 2 python3 examples/train/pufferfish_cnn.py --dataset mnist1d
    shoalrun -np 2 python3 examples/train/pufferfish_cnn.py --compression powersgd --after-compression none

The CNN (conv1 1->32, conv2 32->64, pool, conv3 64->128, pool, fc1 512->256, fc2 256->10;
225 k parameters) trains full rank for the first --warmup-frac of the epochs with
--compression (PowerSGD during the warm-up is Pufferfish's "powerfish" mode). Then
shoal.torch.pufferfish.factorize_model replaces conv2, conv3 and fc1 by pairs of thinner
layers at rank min(out, in*k*k) / --rank-factor (conv1 and fc2, the first and last layers,
stay full rank, as in Pufferfish's hybrid networks), identically on every rank; a new
optimizer trains the factorized model on with --after-compression (default: --compression).
--dataset mnist1d trains the same layers in 1-D on MNIST-1D generated offline (common.mnist1d:
4000 test samples against digits' 360, so a fraction of a point is measurable).
--warmup-frac 1 trains full rank throughout and needs no factorization; --warmup-frac 0
factorizes before the first step (bench/train/run.sh times the factorized step so). A run that
factorizes mid-way also reports each phase's step times ("phases" in --json's results).

Prints per-epoch loss and test accuracy and, last on rank 0, `accuracy=<x>`.
"""
import math
import os
import sys
from collections import OrderedDict

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

FULL_RANK = ("conv1", "fc2")   # the first and the last layer stay full rank


def cnn(dataset="digits"):
    """The digits' 2-D CNN, or for MNIST-1D the same layers in 1-D (kernel 5 over 40 points)."""
    if dataset == "mnist1d":
        conv, pool, kernel, flat = nn.Conv1d, nn.MaxPool1d, 5, 128 * 10
    else:
        conv, pool, kernel, flat = nn.Conv2d, nn.MaxPool2d, 3, 128 * 2 * 2
    pad = kernel // 2
    return nn.Sequential(OrderedDict([
        ("conv1", conv(1, 32, kernel, padding=pad)), ("relu1", nn.ReLU()),
        ("conv2", conv(32, 64, kernel, padding=pad)), ("relu2", nn.ReLU()), ("pool2", pool(2)),
        ("conv3", conv(64, 128, kernel, padding=pad)), ("relu3", nn.ReLU()), ("pool3", pool(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(flat, 256)), ("relu4", nn.ReLU()),
        ("fc2", nn.Linear(256, 10)),
    ]))


def factorize(model, args):
    """The model with conv2, conv3 and fc1 factorized by shoal.torch.pufferfish (issue 14)."""
    try:
        from shoal.torch import pufferfish
    except ImportError as error:
        raise SystemExit("pufferfish_cnn.py: the factorization step needs shoal.torch.pufferfish "
                         "(factorize_model), which this shoal does not have (%s). Train full rank only with "
                         "--warmup-frac 1." % error)
    factorized, names = pufferfish.factorize_model(model, rank_factor=args.rank_factor, skip=FULL_RANK)
    return factorized, names


def default_after_lr(args):
    """The learning rate after the factorization when --after-lr is not given. On digits a tenth of
    --lr (0.05 diverged there: a factor pair's product moves faster than the weight it replaces);
    on MNIST-1D --lr itself (0.01; a tenth left it 3 points under dense, docs/training.md)."""
    return args.lr if args.dataset == "mnist1d" else args.lr / 10


def parameters(model):
    return sum(p.numel() for p in model.parameters())


def train(args, dist, x_train, y_train, x_test, y_test, warmup):
    base = cnn(args.dataset)
    optimizer = torch.optim.SGD(base.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = dist.wrap(base, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    record = common.Recorder(args, dist, "accuracy")
    record.extra = {"parameters_full_rank": parameters(base), "warmup_epochs": warmup}
    factorized_from = None   # the index of the first factorized step in record.step_s

    for epoch in range(1, args.epochs + 1):
        if epoch == warmup + 1:
            base, _ = factorize(base, args)
            after_lr = args.after_lr if args.after_lr is not None else default_after_lr(args)
            optimizer = torch.optim.SGD(base.parameters(), lr=after_lr, momentum=0.9)
            after = args.after_compression or args.compression
            if args.fused and dist.kind == "shoal":
                from shoal.torch import pufferfish
                dist.hvd.broadcast_parameters(base.state_dict(), root_rank=0)
                model, after, plain = base, "fused allreduce", optimizer

                class Fused:  # the optimizer's interface, with one fused allreduce before each step
                    zero_grad = plain.zero_grad

                    @staticmethod
                    def step():
                        pufferfish.allreduce_gradients(base)
                        plain.step()
                optimizer = Fused
            else:
                saved, args.compression = args.compression, after
                model, optimizer = dist.wrap(base, optimizer)
                args.compression = saved
            record.extra["parameters_factorized"] = parameters(base)
            factorized_from = len(record.step_s)
            if dist.rank == 0:
                print("factorized after epoch %d: %d -> %d parameters, then --compression %s" % (
                    warmup, record.extra["parameters_full_rank"], parameters(base), after), flush=True)
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

    # Both phases ran (None: never factorized; 0: from the first step): their steps differ.
    if factorized_from:
        record.extra["phases"] = {"full_rank": record.step_stats(0, factorized_from),
                                  "factorized": record.step_stats(factorized_from)}
    record.finish(base, record.epochs[-1]["accuracy"])


def main():
    p = common.parser(__doc__.splitlines()[0], epochs=8, batch_size=16, lr=None)
    p.add_argument("--warmup-frac", type=float, default=0.25,
                   help="fraction of the epochs trained full rank before factorizing, at least one epoch "
                        "when above 0 (1: never factorize; 0: factorize before the first step)")
    p.add_argument("--dataset", choices=("digits", "mnist1d"), default="digits",
                   help="digits as 1x8x8 images (1437 train, 360 test) or MNIST-1D generated offline "
                        "(common.mnist1d: 8000 train, 4000 test, 40 points; the CNN in 1-D, 382 k parameters)")
    p.add_argument("--rank-factor", type=int, default=4, help="rank = min(out, in*k*k) / this")
    p.add_argument("--after-compression", choices=common.COMPRESSIONS, default=None,
                   help="compressor after the factorization (default: --compression)")
    p.add_argument("--after-lr", type=float, default=None,
                   help="learning rate after the factorization (default: on digits --lr / 10, since a factor "
                        "pair's product moves faster than the weight it replaces and the full rate diverged; on "
                        "mnist1d --lr, since a tenth of it left the factorized model 3 points under dense)")
    p.add_argument("--fused", action="store_true",
                   help="after the factorization, every gradient in one uncompressed allreduce "
                        "(shoal.torch.pufferfish.allreduce_gradients, as Pufferfish does) instead of "
                        "DistributedOptimizer's per-parameter requests")
    args = p.parse_args()
    if args.lr is None:  # 0.05 diverged on MNIST-1D by the fifth epoch; 0.01 reaches ~95 %
        args.lr = 0.01 if args.dataset == "mnist1d" else 0.05
    common.setup(args)
    dist = common.Dist(args)
    if args.dataset == "mnist1d":
        x_train, y_train, x_test, y_test = common.mnist1d()
        if args.train_subset:
            x_train, y_train = x_train[:args.train_subset], y_train[:args.train_subset]
    else:
        x_train, y_train, x_test, y_test = common.digits(args.train_subset)
        x_train, x_test = x_train.view(-1, 1, 8, 8), x_test.view(-1, 1, 8, 8)
    if not 0 <= args.warmup_frac <= 1:
        raise SystemExit("pufferfish_cnn.py: --warmup-frac takes a fraction from 0 to 1, not %g" % args.warmup_frac)
    if args.warmup_frac >= 1:
        warmup = args.epochs
    elif args.warmup_frac == 0:
        warmup = 0
    else:
        warmup = max(1, math.ceil(args.warmup_frac * args.epochs))
    if args.backend == "ddp" and warmup < args.epochs:
        raise SystemExit("pufferfish_cnn.py: backend ddp trains full rank only (--warmup-frac 1): the "
                         "factorization runs through shoal")

    common.each_compression(args, dist, lambda: train(args, dist, x_train, y_train, x_test, y_test, warmup))
    dist.finish()


if __name__ == "__main__":
    main()
