"""What the training examples share: arguments, the distributed backends, sharding, timing, results.

Every example trains one model data-parallel, each rank on its own shard of every batch, under
one of three backends:

  shoal   shoal.torch, written against Horovod's API (`import shoal.torch as hvd`):
          DistributedOptimizer with --compression; started by shoalrun, mpirun, srun or
          bench/netns/run.sh (rank, size and store come from SHOAL_* variables).
  ddp     PyTorch DistributedDataParallel on gloo, the peer a user would pick instead, with
          --ddp-hook none (dense), fp16 (torch's fp16_compress_hook) or powersgd (torch's
          powerSGD_hook). Started the same way: rank and size as shoal reads them (SHOAL_RANK,
          else mpirun's or srun's), the rendezvous at SHOAL_STORE's host, its port + 1 (--ddp-port).
  local   one process, no communication: the same step on one rank, the limit a distributed
          step can at best reach.

--batch-size is per rank, so the step a rank computes is the same under every backend and
world size. Each epoch is a permutation seeded by --seed and the epoch, identical on every rank;
rank r takes every size-th sample from r on, so a run's data does not depend on the backend.
"""
import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import torch

COMPRESSIONS = ("none", "fp16", "bf16", "topk", "powersgd", "sketch")


def parser(description, epochs, batch_size, lr):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--compression", choices=COMPRESSIONS, default="none",
                   help="shoal's compressor for the gradients (backend shoal)")
    p.add_argument("--topk-ratio", type=float, default=0.01, help="topk: fraction of each tensor sent")
    p.add_argument("--powersgd-rank", type=int, default=4, help="powersgd: rank of the approximation")
    p.add_argument("--powersgd-start-iter", type=int, default=0,
                   help="powersgd: plain allreduces for the first N compressed calls")
    p.add_argument("--sketch-values", default=None, help="sketch: values=auto|compact|sketch|dense")
    p.add_argument("--sketch-index", default=None, help="sketch: index=bitmap|bloom")
    p.add_argument("--sketch-exact", choices=("1", "0"), default=None,
                   help="sketch: exact=1 (lossless, the default) or 0 (the values at the union summed in f32 where "
                        "that is not provably exact: 3+ ranks on dense gradients send half the bytes, not bit-exact)")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=batch_size, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=lr, help=None if lr is not None else "default: set by the example from its other options")
    p.add_argument("--max-steps", type=int, default=0, help="cap on steps per epoch (0: the whole epoch)")
    p.add_argument("--train-subset", type=int, default=0, help="use only the first N training samples (0: all)")
    p.add_argument("--backend", choices=("shoal", "ddp", "local"), default="shoal")
    p.add_argument("--ddp-hook", choices=("none", "fp16", "powersgd"), default="none",
                   help="backend ddp: torch's communication hook")
    p.add_argument("--ddp-powersgd-rank", type=int, default=4, help="backend ddp: powerSGD_hook's rank")
    p.add_argument("--ddp-port", type=int, default=0, help="backend ddp: rendezvous port (0: SHOAL_STORE's + 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", default=None, help="rank 0 writes the run's results here")
    p.add_argument("--count-wire", action="store_true",
                   help="count the bytes this rank's network namespace sends on its interfaces other than "
                        "loopback (/proc/net/dev) around every step: tx_bytes_per_step over the timed steps "
                        "(bench/train/run.sh's speed runs, one rank per emulated host)")
    p.add_argument("--compressions", default=None,
                   help="backend shoal: a comma list of compressors trained one after another in this one launch, "
                        "each from the same seed and data as a run of its own (--json FILE: each run's results "
                        "in FILE with {compression} replaced by its name)")
    return p


def compression(args):
    """The shoal.torch Compression that --compression and its options name."""
    import shoal.torch as hvd
    c = args.compression
    if c == "none":
        return hvd.Compression.none
    if c == "fp16":
        return hvd.Compression.fp16
    if c == "bf16":
        return hvd.Compression.bf16
    if c == "topk":
        return hvd.Compression.topk(ratio=args.topk_ratio)
    if c == "powersgd":
        return hvd.Compression.powersgd(rank=args.powersgd_rank, start_iter=args.powersgd_start_iter)
    options = {}
    if args.sketch_values:
        options["values"] = args.sketch_values
    if args.sketch_index:
        options["index"] = args.sketch_index
    if args.sketch_exact:
        options["exact"] = args.sketch_exact
    return hvd.Compression.sketch(**options)


def describe(args):
    """A short name for the configuration, as the reports print it."""
    if args.backend == "local":
        return "local (1 rank, no communication)"
    if args.backend == "ddp":
        return "ddp gloo " + {"none": "dense", "fp16": "+ fp16_compress_hook",
                              "powersgd": "+ powerSGD_hook r=%d" % args.ddp_powersgd_rank}[args.ddp_hook]
    extra = {"topk": " ratio=%g" % args.topk_ratio,
             "powersgd": " r=%d" % args.powersgd_rank}.get(args.compression, "")
    return "shoal " + args.compression + extra


def _interface_for(host):
    """The name of the network interface this machine reaches host through (for gloo)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        local = probe.getsockname()[0]
    finally:
        probe.close()
    listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE, check=True).stdout.decode()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].split("/")[0] == local:
            return fields[1]
    raise RuntimeError("no interface holds %s, the address that reaches %s" % (local, host))


def _launcher_rank_and_size():
    """Rank and size as shoal reads them: SHOAL_RANK/SHOAL_WORLD_SIZE, else mpirun's or srun's."""
    for rank, size in (("SHOAL_RANK", "SHOAL_WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("SLURM_PROCID", "SLURM_NTASKS")):
        if os.environ.get(rank) and os.environ.get(size):
            return int(os.environ[rank]), int(os.environ[size])
    raise SystemExit("backend ddp: no rank in the environment (SHOAL_RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID); "
                     "start it with shoalrun, mpirun, srun or bench/netns/run.sh")


class Dist:
    """The backend: rank and size, wrapping the model and optimizer, small reductions, the end."""

    def __init__(self, args):
        self.args = args
        self.kind = args.backend
        self.rank, self.size = 0, 1
        if self.kind == "shoal":
            import shoal.torch as hvd
            self.hvd = hvd
            hvd.init()
            self.rank, self.size = hvd.rank(), hvd.size()
        elif self.kind == "ddp":
            import torch.distributed as dist
            self.dist = dist
            self.rank, self.size = _launcher_rank_and_size()
            store = os.environ.get("SHOAL_STORE", "")
            if not store.startswith("tcp://"):
                raise SystemExit("backend ddp needs SHOAL_STORE=tcp://host:port (got %r)" % store)
            host, port = store[len("tcp://"):].rsplit(":", 1)
            port = args.ddp_port or int(port) + 1
            os.environ.setdefault("GLOO_SOCKET_IFNAME", _interface_for(host))
            dist.init_process_group("gloo", init_method="tcp://%s:%d" % (host, port), rank=self.rank,
                                    world_size=self.size)

    def wrap(self, model, optimizer, compression_override=None):
        """Returns (model to call, optimizer to step) for this backend, parameters made equal on every rank."""
        if self.kind == "shoal":
            hvd = self.hvd
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            chosen = compression_override if compression_override is not None else compression(self.args)
            return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                   compression=chosen)
        if self.kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            ddp = DistributedDataParallel(model)
            if self.args.ddp_hook == "fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif self.args.ddp_hook == "powersgd":
                from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
                # start_powerSGD_iter must be > 1: DDP rebuilds its buckets after the first step.
                state = powerSGD_hook.PowerSGDState(process_group=None,
                                                    matrix_approximation_rank=self.args.ddp_powersgd_rank,
                                                    start_powerSGD_iter=2, random_seed=self.args.seed)
                ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            return ddp, optimizer
        return model, optimizer

    def mean(self, values):
        """The element-wise mean over ranks of a list of floats."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.kind == "shoal" and self.size > 1:
            t = self.hvd.allreduce(t, name="train.mean", op=self.hvd.Average)
        elif self.kind == "ddp":
            self.dist.all_reduce(t)
            t /= self.size
        return t.tolist()

    def identical(self, model):
        """True when every rank holds bit-identical parameters (a digest of their bytes, compared)."""
        digest = parameter_digest(model)
        if self.kind == "shoal" and self.size > 1:
            digests = self.hvd.allgather_object(digest, name="train.digest")
        elif self.kind == "ddp":
            digests = [None] * self.size
            self.dist.all_gather_object(digests, digest)
        else:
            digests = [digest]
        return all(d == digests[0] for d in digests)

    def finish(self):
        if self.kind == "shoal":
            self.hvd.shutdown()
        elif self.kind == "ddp":
            self.dist.destroy_process_group()
            # torch 1.13 can deadlock at interpreter exit after DDP with a comm hook (seen with
            # fp16_compress_hook: ~ProcessGroupGloo joins a worker thread that waits for the GIL).
            # Everything is written and flushed by now, so leave without the teardown.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def parameter_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def setup(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)


def each_compression(args, dist, train):
    """Calls train() once per compressor: --compression, or each of --compressions in turn (one
    launch for several compressors; the smoke test runs every compressor of an example so). Each
    run gets args.compression and args.json set for it and starts from torch's seed, so its model
    starts as a run of its own would (the examples draw nothing else from the global generator)."""
    if not args.compressions:
        train()
        return
    names = [c.strip() for c in args.compressions.split(",") if c.strip()]
    unknown = [c for c in names if c not in COMPRESSIONS]
    if unknown or not names:
        raise SystemExit("--compressions takes a comma list of %s, not %r"
                         % ("|".join(COMPRESSIONS), args.compressions))
    if args.backend != "shoal":
        raise SystemExit("--compressions needs --backend shoal")
    pattern = args.json
    for name in names:
        args.compression = name
        if pattern:
            args.json = pattern.replace("{compression}", name) if "{compression}" in pattern else \
                "%s.%s.json" % (os.path.splitext(pattern)[0], name)
        if dist.rank == 0:
            print("run compression=%s" % name, flush=True)
        torch.manual_seed(args.seed)
        train()


def shard(n, epoch, seed, rank, size, batch, max_steps):
    """This rank's sample indices for each step of an epoch: one permutation shared by all ranks."""
    g = torch.Generator()
    g.manual_seed(seed * 100003 + epoch)
    order = torch.randperm(n, generator=g)
    steps = n // (batch * size)
    if max_steps:
        steps = min(steps, max_steps)
    if steps == 0:
        raise SystemExit("%d training samples cannot fill one step of %d ranks x %d" % (n, size, batch))
    mine = order[rank::size]
    return [mine[s * batch:(s + 1) * batch] for s in range(steps)]


class Recorder:
    """Per-step times and per-epoch results; prints the epoch lines and the last `accuracy=` line."""

    def __init__(self, args, dist, metric_name):
        self.args, self.dist, self.metric = args, dist, metric_name
        self.step_s = []
        self.cpu_s = []
        self.tx = []   # --count-wire: tx[i] bytes sent before step i, tx[i + 1] after it
        self.train_s = 0.0
        self.epochs = []
        self.extra = {}

    def timed_step(self, step):
        if self.args.count_wire and not self.tx:
            self.tx.append(tx_bytes())
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step()
        elapsed = time.perf_counter() - start
        if self.args.count_wire:
            self.tx.append(tx_bytes())
        # CPU of every thread of this process (shoal's runtime thread too): next to the
        # wall-clock step it says how much of the step was this rank's work, on a shared machine.
        self.cpu_s.append(time.process_time() - cpu_start)
        self.step_s.append(elapsed)
        self.train_s += elapsed
        return loss

    def epoch(self, epoch, losses, metrics):
        """losses: this rank's step losses; metrics: dict of test metrics (rank-independent)."""
        mean_loss = self.dist.mean([sum(losses) / max(1, len(losses))])[0]
        row = {"epoch": epoch, "loss": mean_loss, "train_s": self.train_s}
        row.update(metrics)
        self.epochs.append(row)
        if self.dist.rank == 0:
            text = " ".join("%s=%.4f" % (k, v) for k, v in metrics.items())
            print("epoch %d/%d loss=%.4f %s train_s=%.2f step_ms=%.2f" % (
                epoch, self.args.epochs, mean_loss, text, self.train_s, 1e3 * self._recent_step()), flush=True)

    def _recent_step(self):
        recent = self.step_s[-20:]
        return sum(recent) / max(1, len(recent))

    def step_stats(self, first=0, last=None):
        """Mean and median time of steps first..last-1 (default: all), their first 3 (warm-up, DDP's
        bucket rebuild, a new optimizer's first steps) left out."""
        steps, cpus = self.step_s[first:last], self.cpu_s[first:last]
        kept = sorted(steps[3:] or steps)
        mean = sum(kept) / len(kept)
        cpu = cpus[3:] or cpus
        stats = {"step_ms_mean": 1e3 * mean, "step_ms_median": 1e3 * kept[len(kept) // 2], "steps": len(steps),
                 "cpu_ms_per_step": 1e3 * sum(cpu) / len(cpu)}
        if self.tx:
            # The same steps as the times: the set-up's traffic (the parameters' broadcast) and the
            # first 3 steps are not in it.
            begin = first + (3 if len(steps) > 3 else 0)
            end = first + len(steps)
            if self.tx[begin] is not None and self.tx[end] is not None:
                stats["tx_bytes_per_step"] = (self.tx[end] - self.tx[begin]) / (end - begin)
        return stats

    def finish(self, model, final_metric):
        # Every rank must take part in the digest exchange; only rank 0 reports.
        identical = self.dist.identical(model)
        stats = self.step_stats()
        if self.dist.rank == 0:
            print("step_ms_mean=%.3f step_ms_median=%.3f cpu_ms_per_step=%.3f steps=%d ranks=%d config=%s" % (
                stats["step_ms_mean"], stats["step_ms_median"], stats["cpu_ms_per_step"], stats["steps"], self.dist.size,
                describe(self.args).replace(" ", "_")), flush=True)
            print("identical=%d" % int(identical), flush=True)
            if self.args.json:
                result = {"script": os.path.basename(sys.argv[0]), "config": describe(self.args),
                          "args": vars(self.args), "ranks": self.dist.size, "epochs": self.epochs,
                          "identical": identical, self.metric: final_metric, "metric": self.metric}
                result.update(stats)
                result.update(self.extra)
                with open(self.args.json, "w") as f:
                    json.dump(result, f, indent=1)
            print("accuracy=%.6f" % final_metric, flush=True)


def tx_bytes():
    """Bytes sent so far on this network namespace's interfaces other than loopback (/proc/net/dev
    is per namespace: on an emulated host, its link), or None where it cannot be read."""
    try:
        with open("/proc/net/dev") as f:
            lines = f.read().splitlines()[2:]
        return sum(int(data.split()[8]) for name, data in (line.split(":", 1) for line in lines)
                   if name.strip() != "lo")
    except (OSError, ValueError, IndexError):
        return None


def digits(subset=0):
    """scikit-learn's digits (1797 8x8 images, shipped inside the package): a fixed 1437/360
    train/test split, pixels standardized. Returns (x_train, y_train, x_test, y_test)."""
    data = _digits_array()
    x = torch.tensor(data[:, :64], dtype=torch.float32)
    x = (x - x.mean()) / x.std()  # one scale for every pixel: zero mean, unit variance
    y = torch.tensor(data[:, 64], dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(12345))
    x, y = x[order], y[order]
    train, test = torch.arange(1437), torch.arange(1437, len(y))
    if subset:
        train = train[:subset]
    return x[train], y[train], x[test], y[test]


def _digits_array():
    """The digits as a [1797, 65] array (64 pixels, then the label). Read straight from the file
    scikit-learn ships, since importing sklearn costs seconds per rank; load_digits() otherwise."""
    import gzip
    import importlib.util
    import numpy
    spec = importlib.util.find_spec("sklearn")
    if spec and spec.origin:
        path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            with gzip.open(path) as f:
                return numpy.loadtxt(f, delimiter=",")
    from sklearn.datasets import load_digits
    data = load_digits()
    return numpy.concatenate([data.data, data.target[:, None]], axis=1)


def classify(model, x, y, batch=512):
    """Test accuracy of a classifier."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    model.train()
    return correct / len(y)


# MNIST-1D's ten templates, drawn for shoal (not the reference set's): 12 points each, a stroke-like
# profile per digit that a shift or a shear alone does not turn into another's.
_MNIST1D_TEMPLATES = (
    (0.0, 0.6, 1.0, 0.9, 0.4, -0.3, -0.9, -1.0, -0.6, 0.0, 0.5, 0.0),     # 0: one slow wave
    (0.0, 0.0, 0.2, 1.0, 1.0, 1.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0),          # 1: a single plateau
    (0.0, 0.8, 0.2, 0.8, 0.2, 0.8, 0.0, -0.5, -0.5, -0.5, -0.5, 0.0),      # 2: ripples, then a trough
    (0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0),          # 3: four peaks
    (0.0, -1.0, -1.0, 0.0, 1.0, 1.0, 0.0, -1.0, -1.0, 0.0, 0.0, 0.0),      # 4: trough, peak, trough
    (0.0, 0.3, 0.6, 0.9, 1.2, 1.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0),        # 5: a ramp that drops
    (0.0, -0.5, -0.5, -1.5, -1.2, -0.9, -0.6, -0.3, 0.0, 0.0, 0.0, 0.0),   # 6: a drop that ramps back
    (0.0, 1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),        # 7: a short fast zigzag
    (0.0, 0.5, 1.0, 0.5, 0.0, 0.5, 1.0, 0.5, 0.0, -0.8, -0.8, 0.0),        # 8: two humps and a dip
    (0.0, 0.0, 0.0, -0.8, -0.8, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0),        # 9: a dip, then a long plateau
)


def mnist1d(n_train=8000, n_test=4000, length=40, seed=1234):
    """MNIST-1D (Greydanus, "Scaling down deep learning", 2020) generated here, offline, after that
    paper's recipe with shoal's own ten templates: each sample is its digit's 12-point template,
    stretched over a random width and amplitude, placed at a random offset of a 64-point frame,
    sheared (a random linear ramp added), with smooth correlated noise and a little white noise,
    then resampled to `length` points. A fixed seed, so every rank and run holds the same set;
    standardized with one scale. Far more test samples than digits' 360 (one sample is 0.025 of a
    point at 4000), and harder: a linear model does poorly, a CNN well.
    Returns (x_train, y_train, x_test, y_test), x as [n, 1, length]."""
    import numpy
    rng = numpy.random.default_rng(seed)
    n, frame = n_train + n_test, 64
    templates = numpy.asarray(_MNIST1D_TEMPLATES, dtype=numpy.float64)
    y = rng.integers(0, 10, size=n)
    width = rng.integers(24, 41, size=n)                 # frame points the template covers
    start = rng.integers(0, frame - 23, size=n)          # its offset; past the end it wraps around
    amplitude = rng.uniform(0.75, 1.25, size=n)
    shear = rng.uniform(-0.75, 0.75, size=n)
    grid = numpy.arange(frame)
    # Where each frame point falls on its template (0..11), or outside it.
    pos = ((grid[None, :] - start[:, None]) % frame) * 11.0 / (width[:, None] - 1)
    inside = pos <= 11.0
    low = numpy.minimum(numpy.floor(pos).astype(int), 10)
    frac = pos - low
    t = templates[y]
    signal = numpy.where(inside, (1 - frac) * numpy.take_along_axis(t, numpy.clip(low, 0, 10), 1) +
                         frac * numpy.take_along_axis(t, numpy.clip(low + 1, 0, 11), 1), 0.0)
    signal = amplitude[:, None] * signal + shear[:, None] * (grid[None, :] / (frame - 1) - 0.5)
    kernel = numpy.exp(-0.5 * (numpy.arange(-6, 7) / 2.0) ** 2)
    kernel /= numpy.sqrt((kernel ** 2).sum())            # unit variance after smoothing
    white = rng.standard_normal((n, frame + 12))
    smooth = numpy.stack([numpy.convolve(row, kernel, mode="valid") for row in white])
    signal += 0.25 * smooth + 0.02 * rng.standard_normal((n, frame))
    # Resample the frame to `length` points (linear interpolation).
    at = numpy.linspace(0, frame - 1, length)
    x = numpy.stack([numpy.interp(at, grid, row) for row in signal])
    x = (x - x.mean()) / x.std()
    x = torch.tensor(x, dtype=torch.float32).view(n, 1, length)
    y = torch.tensor(y, dtype=torch.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]
