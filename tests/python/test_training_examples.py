"""Smoke test of the training examples (examples/train/): every example with every compressor,
2 ranks under shoalrun, 2 short epochs; one launch per example trains it with each compressor in
turn (--compressions), each run from the same seed and data as a launch of its own. Each run
must make the training loss fall and reach an accuracy floor well above chance; with the sketch
(lossless) every rank must end with bit-identical parameters. The full runs are benchmarks
(bench/train/run.sh), not tests.

Needs SHOAL_LIBRARY (the libshoal.so under test; shoalrun is taken from the same build tree),
as scripts/test_python.sh sets it. Skips only when torch is absent.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "examples", "train")
COMPRESSIONS = ("none", "fp16", "bf16", "topk", "powersgd", "sketch")

# Small runs: (script, arguments, metric, floor). Chance is 0.1 for every metric here (ten
# digit classes; hit rate at 10 among 100 candidates); the floors sit far above it and below
# what each run reached on a loaded 2-core machine (docs/training.md).
RUNS = {
    "digits_mlp": ("digits_mlp.py", ["--epochs", "2", "--max-steps", "12"], "accuracy", 0.6),
    "embeddings": ("embeddings.py", ["--epochs", "2", "--users", "20000", "--items", "4000",
                                     "--interactions", "8192", "--test", "500"], "hit_rate", 0.25),
    "pufferfish_cnn": ("pufferfish_cnn.py", ["--epochs", "2", "--warmup-frac", "1", "--max-steps", "30"],
                       "accuracy", 0.3),
}


def _library():
    path = os.environ.get("SHOAL_LIBRARY")
    if not path:
        pytest.fail("SHOAL_LIBRARY is not set; run the tests through scripts/test_python.sh <build dir>")
    return path


def _shoalrun():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(_library()))), "bin", "shoalrun")
    if not os.path.exists(path):
        pytest.fail("shoalrun not found at %s (build the shoalrun target)" % path)
    return path


def train(script, args, tmp_path, timeout_s=150, result_name="result.json"):
    """Runs an example on 2 ranks; returns (exit status, output, rank 0's JSON results or None)."""
    result = tmp_path / result_name
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "bindings", "python"),
                                                      env.get("PYTHONPATH")]))
    command = [_shoalrun(), "-np", "2", "--timeout-s", str(timeout_s), sys.executable,
               os.path.join(EXAMPLES, script)] + args + ["--json", str(result)]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          timeout=timeout_s + 30)
    out = proc.stdout.decode(errors="replace")
    data = json.loads(result.read_text()) if result.exists() else None
    return proc.returncode, out, data


def check_training(out, data, metric, floor):
    assert data is not None, out
    epochs = data["epochs"]
    assert len(epochs) == 2, out
    assert epochs[1]["loss"] < epochs[0]["loss"], "the loss did not fall:\n" + out
    assert data[metric] >= floor, "%s %.4f is under the floor %.2f:\n%s" % (metric, data[metric], floor, out)
    # The last line rank 0 prints is the final metric.
    last = [line for line in out.splitlines() if line.startswith("[0] ")][-1]
    assert last == "[0] accuracy=%.6f" % data[metric], out


_launches = {}


def every_compression(example, tmp_path_factory):
    """One launch of an example on 2 ranks that trains it with every compressor in turn
    (--compressions: each run from the same seed and data as a launch of its own would be; starting
    torch in two processes is most of a short run's time). Returns (exit status, output, {compression:
    rank 0's JSON results or None}), the same for every test of the example."""
    if example not in _launches:
        script, args, _, _ = RUNS[example]
        tmp = tmp_path_factory.mktemp(example)
        rc, out, _ = train(script, args + ["--compressions", ",".join(COMPRESSIONS), "--seed", "1"], tmp,
                           timeout_s=150 * len(COMPRESSIONS), result_name="{compression}.json")
        results = {}
        for c in COMPRESSIONS:
            path = tmp / ("%s.json" % c)
            results[c] = json.loads(path.read_text()) if path.exists() else None
        _launches[example] = (rc, out, results)
    return _launches[example]


def run_output(out, compression):
    """The part of a --compressions launch's output that belongs to one compressor's run."""
    sections = out.split("[0] run compression=")
    for section in sections[1:]:
        if section.split("\n", 1)[0].strip() == compression:
            return "[0] run compression=" + section
    return out


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("example", sorted(RUNS))
def test_example_trains(example, compression, tmp_path_factory):
    pytest.importorskip("torch")
    _, _, metric, floor = RUNS[example]
    rc, whole, results = every_compression(example, tmp_path_factory)
    out, data = run_output(whole, compression), results[compression]
    assert data is not None, "no result from the %s run:\n%s" % (compression, whole)
    assert rc == 0, whole
    check_training(out, data, metric, floor)
    assert data["config"].startswith("shoal " + compression), out
    if compression == "sketch":
        # Lossless and the same on every rank: a digest of every rank's parameters, compared.
        assert data["identical"] is True, "ranks ended with different parameters under the sketch:\n" + out


# Factorized from the first step, the SVD of the random initial weights trains slowly at the
# default --after-lr (a tenth of --lr: accuracy 0.13 after 2 x 30 steps); at --lr and 2 whole
# epochs it passes the floor (0.63 with seed 1).
FROM_THE_START = ["--warmup-frac", "0", "--after-lr", "0.05", "--max-steps", "44"]


@pytest.mark.parametrize("fused,args", [(False, ["--warmup-frac", "0.5", "--max-steps", "30"]),
                                        (True, ["--warmup-frac", "0.5", "--max-steps", "30"]),
                                        (False, FROM_THE_START)], ids=["warm-up", "warm-up-fused", "from-the-start"])
def test_pufferfish_factorizes(fused, args, tmp_path):
    """Full rank for the first epoch, then shoal.torch.pufferfish's factorized model, its gradients
    through DistributedOptimizer or (fused) in one allreduce, each phase's steps timed on their own;
    or (warm-up 0, as bench/train/run.sh times the factorized step) factorized before the first step."""
    pytest.importorskip("torch")
    rc, out, data = train("pufferfish_cnn.py", ["--epochs", "2", "--seed", "1"] + args + (["--fused"] if fused else []),
                          tmp_path)
    if rc != 0 and "needs shoal.torch.pufferfish" in out:
        # The script's own error, not a crash: shoal.torch.pufferfish (issue 14) is not there yet.
        pytest.xfail("shoal.torch.pufferfish is not in this shoal yet")
    assert rc == 0, out
    check_training(out, data, "accuracy", 0.3)
    assert data["parameters_factorized"] < data["parameters_full_rank"], out
    assert data["identical"] is True, "ranks ended with different factorized parameters:\n" + out
    if args is FROM_THE_START:
        assert data["warmup_epochs"] == 0 and "phases" not in data, out
        assert "[0] factorized after epoch 0:" in out, out
    else:
        assert data["warmup_epochs"] == 1, out
        phases = data["phases"]
        assert phases["full_rank"]["steps"] == 30 and phases["factorized"]["steps"] == 30, phases
        assert all(p["step_ms_median"] > 0 for p in phases.values()), phases


def test_pufferfish_on_mnist1d(tmp_path):
    """The CNN in 1-D on MNIST-1D (pufferfish_cnn.py --dataset mnist1d, bench/train's
    pufferfish_mnist1d task): full rank for the first epoch, then factorized; the loss falls, the
    accuracy passes a floor (0.48-0.51 with seeds 1-3 after 2 x 125 steps; chance 0.1) and the ranks
    end bit-identical."""
    pytest.importorskip("torch")
    rc, out, data = train("pufferfish_cnn.py", ["--dataset", "mnist1d", "--epochs", "2", "--seed", "1",
                                                "--warmup-frac", "0.5", "--max-steps", "125"], tmp_path)
    assert rc == 0, out
    check_training(out, data, "accuracy", 0.35)
    assert data["parameters_full_rank"] == 382090 and data["parameters_factorized"] == 119434, out
    assert data["identical"] is True, "ranks ended with different factorized parameters:\n" + out


def test_mnist1d_is_fixed_balanced_and_standardized():
    """common.mnist1d: the same bits on every call (every rank builds it on its own), the sizes
    asked for, all ten classes in both parts in about equal numbers, one standardization, and no
    test sample equal to a training one."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, EXAMPLES)
    try:
        import common
    finally:
        sys.path.remove(EXAMPLES)
    first, again = common.mnist1d(), common.mnist1d()
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    x_train, y_train, x_test, y_test = first
    assert x_train.shape == (8000, 1, 40) and x_test.shape == (4000, 1, 40)
    assert y_train.shape == (8000,) and y_test.shape == (4000,)
    for y in (y_train, y_test):
        counts = torch.bincount(y, minlength=10)
        assert len(counts) == 10 and int(counts.min()) > 0.8 * len(y) / 10, counts
    both = torch.cat([x_train, x_test])
    assert abs(float(both.mean())) < 1e-4 and abs(float(both.std()) - 1) < 1e-3
    assert not common.mnist1d(n_train=10, n_test=10, seed=7)[0].equal(common.mnist1d(n_train=10, n_test=10)[0])
    train_rows = {tuple(row.tolist()) for row in x_train.view(8000, -1)}
    assert not any(tuple(row.tolist()) in train_rows for row in x_test.view(4000, -1))
