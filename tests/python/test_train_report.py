"""bench/train/report.py's aggregation of repeated speed runs (run.sh --repeats N), on synthetic
results: medians and ranges over the repeats, ratios paired within a repeat, and runs that failed or
never ran reported as such instead of dropped. Also that the single-run layout still gives its old
table. Pure Python (no torch, no libshoal): milliseconds.
"""
import importlib.util
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("train_report", os.path.join(ROOT, "bench", "train", "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def result(directory, name, step_ms, cpu_ms=10.0, steps=20):
    """A run that finished: its log and rank 0's JSON, as examples/train/common.py writes them."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name + ".log"), "w") as f:
        f.write("# launcher\nstep_ms_median=%.3f\n# exit status 0\n" % step_ms)
    with open(os.path.join(directory, name + ".json"), "w") as f:
        json.dump({"step_ms_median": step_ms, "step_ms_mean": step_ms + 1.0, "steps": steps,
                   "cpu_ms_per_step": cpu_ms}, f)


def failed(directory, name, line):
    """A run that ended without a result: its log only."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name + ".log"), "w") as f:
        f.write("# launcher\n%s\n# exit status 134\n" % line)


def planned(directory, names):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "planned"), "w") as f:
        f.write("\n".join(names) + "\n")


def repeated_results(out):
    """3 repeats planned at 1gbit; the third never started for digits_mlp (only repeat-1 and -2 exist)."""
    os.makedirs(os.path.join(out, "speed"))
    with open(os.path.join(out, "speed", "repeats"), "w") as f:
        f.write("3\n")
    emb = os.path.join(out, "speed", "1gbit", "embeddings")
    sketch = [40.0, 50.0, 45.0]
    ddp = [160.0, 150.0, 200.0]   # paired: 4.00, 3.00, 4.44 (median 4.00); medians' ratio 160/45 = 3.56
    local = [20.0, 25.0, 18.0]
    for k in range(3):
        d = os.path.join(emb, "repeat-%d" % (k + 1))
        planned(d, ["shoal-none", "shoal-sketch", "ddp-none", "ddp-powersgd", "local"])
        result(d, "local", local[k])
        result(d, "shoal-sketch", sketch[k])
        result(d, "ddp-none", ddp[k])
        failed(d, "ddp-powersgd", "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                                  "  what():  [enforce fail at pair.cc:510] op.preamble.length <= op.nbytes")
        if k != 1:  # shoal-none: planned in repeat 2 but neither log nor result there
            result(d, "shoal-none", 150.0 + k)
    digits = os.path.join(out, "speed", "1gbit", "digits_mlp")
    for k, (psgd, dense) in enumerate([(20.0, 50.0), (25.0, 45.0)]):
        d = os.path.join(digits, "repeat-%d" % (k + 1))
        planned(d, ["shoal-powersgd", "ddp-none", "local"])
        result(d, "local", 8.0)
        result(d, "shoal-powersgd", psgd)
        result(d, "ddp-none", dense)
    return out


def test_spread_median_and_range(report):
    s = report.spread([3.0, None, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"], s["of"]) == (2.0, 1.0, 3.0, 3, 4)
    assert report.spread([4.0, 1.0])["median"] == 2.5
    assert report.spread([None, None]) is None
    assert report.show(s) == "2.0 [1.0–3.0] (3 of 4)"
    assert report.show(None) == "—"


def test_ratios_are_paired_within_a_repeat(report):
    ratios = report.paired([160.0, 150.0, 200.0], [40.0, 50.0, 45.0])
    assert ratios == pytest.approx([4.0, 3.0, 200.0 / 45.0])
    assert report.spread(ratios)["median"] == pytest.approx(4.0)   # not the medians' ratio, 160 / 45
    # A repeat where either side has no value has no pair; a factor scales every pair.
    assert report.paired([100.0, None, 90.0], [50.0, 30.0, None], factor=0.5) == [1.0, None, None]


def test_failed_and_missing_runs_are_listed(report, tmp_path):
    out = repeated_results(str(tmp_path))
    names, table = report.load_repeats(os.path.join(out, "speed", "1gbit", "embeddings"), expected=3)
    assert names == ["repeat-1", "repeat-2", "repeat-3"]
    assert [report.status(e) for e in table["shoal-none"]] == ["ok", "missing: did not run", "ok"]
    assert all(report.status(e).startswith("failed: what():  [enforce fail") for e in table["ddp-powersgd"])
    assert report.runs_text(table["shoal-none"], names) == "2 of 3 ok; repeat-2: missing: did not run"
    # A repeat that never started at all counts as one, missing for every configuration.
    names, table = report.load_repeats(os.path.join(out, "speed", "1gbit", "digits_mlp"), expected=3)
    assert names == ["repeat-1", "repeat-2", "repeat-3"]
    assert report.status(table["shoal-powersgd"][2]) == "missing: repeat 3 did not run"
    assert report.spread([report.step_ms(e) for e in table["shoal-powersgd"]])["n"] == 2


def test_a_run_past_its_time_limit_failed(report, tmp_path):
    """A launch that timeout(1) ended (124, or 137 when killed) failed, even when rank 0 wrote its
    result before the limit; so does one that exited with an error after writing it."""
    d = str(tmp_path)
    for name, status in (("limit", 124), ("killed", 137), ("crashed", 134), ("fine", 0)):
        result(d, name, 40.0)
        with open(os.path.join(d, name + ".log"), "a") as f:
            if status == 134:
                f.write("Segmentation fault\n")
            f.write("# exit status %d\n" % status)
    runs = report.load(os.path.join(d, "*.log"))
    assert report.status(runs["limit"]) == "failed: hit its time limit (exit status 124); rank 0 had written its result"
    assert report.status(runs["killed"]).startswith("failed: was killed (SIGKILL: its time limit's kill, or another) (exit status 137)")
    assert report.status(runs["crashed"]) == "failed: Segmentation fault (exit status 134)"
    assert report.status(runs["fine"]) == "ok" and report.step_ms(runs["fine"]) == 40.0
    os.remove(os.path.join(d, "limit.json"))
    assert report.status(report.load(os.path.join(d, "limit.log"))["limit"]) == \
        "failed: hit its time limit (exit status 124)"


def test_report_tables_and_targets(report, tmp_path, monkeypatch, capsys):
    out = repeated_results(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["report.py", out, "--epochs-to-target",
                                      "digits_mlp/ddp-none=6.0,digits_mlp/shoal-powersgd=5.0"])
    report.main()
    text = open(os.path.join(out, "tables.md")).read()
    lines = text.splitlines()
    row = next(l for l in lines if l.startswith("| shoal-sketch |"))
    assert "| 45.0 [40.0–50.0] | 40.0, 50.0, 45.0 |" in row
    assert "| 4.00× [3.00–4.44] |" in row                     # DDP dense / this, paired
    assert "| 2.00× [2.00–2.50] |" in row                     # this / no-communication, paired
    assert row.endswith("| 3 of 3 ok |")
    failed_row = next(l for l in lines if l.startswith("| ddp-powersgd |"))
    assert "0 of 3 ok; repeat-1, repeat-2, repeat-3: failed: what():" in failed_row and "| — |" in failed_row
    # Against each peer: a peer that failed in every repeat gives no pair, and says why.
    peer_row = next(l for l in lines if l.startswith("| 1gbit | shoal-sketch | ddp-powersgd, per step |"))
    assert "0 of 3; repeat-1, repeat-2, repeat-3: ddp-powersgd failed: what():" in peer_row
    none_row = next(l for l in lines if l.startswith("| 1gbit | shoal-none | ddp-none, per step |"))
    assert "2 of 3; repeat-2: shoal-none missing: did not run" in none_row
    # The goals are judged on the paired medians.
    assert ("| embeddings, 1gbit: sketch ≥ 3.74× faster per step than DDP dense (paired median, 3 repeats) "
            "| 4.00× [3.00–4.44] | yes |") in lines
    # Digits: time to dense's accuracy = steps ratio x epochs ratio (6.0 / 5.0), per repeat: 3.00, 2.16.
    tta = next(l for l in lines if l.startswith("| 1gbit | shoal-powersgd | ddp-none, time to dense's accuracy"))
    assert ("| 3.00, 2.16, — | 2.58× [2.16–3.00] (2 of 3) "
            "| 2 of 3; repeat-3: shoal-powersgd missing: repeat 3 did not run") \
        in tta
    assert any(l.startswith("| digits_mlp, 1gbit: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner")
               and "shoal-powersgd: 2.58× [2.16–3.00] (2 of 3) (derived) | yes |" in l for l in lines)
    assert any(l.startswith("| digits_mlp, 1gbit: best shoal step within 1.25× of no communication")
               and "| no |" in l for l in lines)
    capsys.readouterr()


def test_single_run_layout_keeps_its_table(report, tmp_path, monkeypatch, capsys):
    out = str(tmp_path)
    result(os.path.join(out, "speed", "local", "digits_mlp"), "local", 8.0)
    task = os.path.join(out, "speed", "1gbit", "digits_mlp")
    result(task, "shoal-none", 50.0)
    result(task, "ddp-none", 48.0)
    failed(task, "ddp-powersgd", "Terminated")
    monkeypatch.setattr(sys, "argv", ["report.py", out])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    assert "No communication (the same step on one rank): 8.0 ms (CPU 10.0 ms)." in lines
    assert any(l.startswith("| 1gbit | shoal-none | 50.0 | 51.0 | 10.0 | 0.96× | 6.25× |") for l in lines)
    assert "| 1gbit | ddp-powersgd | | | | | | | | | failed: Terminated (exit status 134) |" in lines
    assert not any("repeat" in l for l in lines)
    capsys.readouterr()


# ---- pufferfish_cnn: two-phase configurations (full rank for the warm-up, then factorized) ----------

STEPS_PER_EPOCH = 44


def fidelity_run(directory, name, seed, finals, first, warmup=None, epochs=8):
    """A fidelity run whose test accuracy is 0.5 until epoch `first` (None: never), then dense's
    final accuracy for that seed."""
    os.makedirs(directory, exist_ok=True)
    final = finals[seed]
    accuracy = [final if first is not None and e >= first else 0.5 for e in range(1, epochs + 1)]
    stem = os.path.join(directory, "%s-s%d" % (name, seed))
    with open(stem + ".log", "w") as f:
        f.write("# launcher\n# exit status 0\n")
    result = {"epochs": [{"epoch": e, "loss": 1.0 / e, "accuracy": a, "train_s": 2.0 * e}
                         for e, a in enumerate(accuracy, 1)],
              "accuracy": accuracy[-1], "metric": "accuracy", "identical": True, "step_ms_median": 40.0,
              "steps": STEPS_PER_EPOCH * epochs}
    if warmup is not None:
        result["warmup_epochs"] = warmup
    with open(stem + ".json", "w") as f:
        json.dump(result, f)


def cnn_fidelity(out):
    """Three seeds. Epochs to dense's accuracy: shoal-none and ddp-none 4, shoal-powersgd 5;
    pufferfish (warm-up 2) 5, 6 and 1, so 5/3 full rank + 7/3 factorized (seed 2 reached it in the
    warm-up); powerfish 4 on each seed: 2 + 2; pufferfish-fused never on seed 2."""
    d = os.path.join(out, "fidelity", "pufferfish_cnn")
    finals = {0: 0.98, 1: 0.97, 2: 0.975}
    for seed in range(3):
        fidelity_run(d, "shoal-none", seed, finals, 4, warmup=8)
        fidelity_run(d, "ddp-none", seed, finals, 4, warmup=8)
        fidelity_run(d, "shoal-powersgd", seed, finals, 5, warmup=8)
        fidelity_run(d, "pufferfish", seed, finals, (5, 6, 1)[seed], warmup=2)
        fidelity_run(d, "powerfish", seed, finals, 4, warmup=2)
        fidelity_run(d, "pufferfish-fused", seed, finals, (3, 3, None)[seed], warmup=2)


def test_epochs_to_dense_accuracy_per_seed_then_on_the_seeds_mean(report):
    """Each seed's first epoch at its own dense's final less half a point; where one seed never gets
    there, the first epoch at which the seeds' mean reaches their dense finals' mean less half a
    point, for every seed; "not reached" when the mean never does either."""
    def run(*accuracy):
        return {"epochs": [{"epoch": e, "accuracy": a} for e, a in enumerate(accuracy, 1)]}
    dense = {0: {"accuracy": 0.98}, 1: {"accuracy": 0.96}}
    text, mean, firsts, basis = report.epochs_to({0: run(0.90, 0.976, 0.98), 1: run(0.957, 0.96, 0.96)},
                                                 "accuracy", dense)
    assert (mean, firsts, basis) == (1.5, {0: 2, 1: 1}, "seeds")
    # Seed 0 ends 1 point under its dense (0.97 < 0.975); the mean reaches 0.97 - 0.005 at epoch 3.
    text, mean, firsts, basis = report.epochs_to({0: run(0.90, 0.95, 0.97), 1: run(0.90, 0.95, 0.96)},
                                                 "accuracy", dense)
    assert (mean, firsts, basis) == (3.0, {0: 3, 1: 3}, "mean")
    assert text == "3 on the seeds' mean (seed 0 never reaches its dense's)"
    # Neither a seed nor the mean: not reached, and no epochs to derive a time from.
    assert report.epochs_to({0: run(0.90, 0.95, 0.96), 1: run(0.90, 0.95, 0.95)}, "accuracy", dense) == (
        "not reached", None, None, None)
    # The mean curve needs the same epochs on every seed.
    text, mean, _, _ = report.epochs_to({0: run(0.90, 0.95, 0.97), 1: run(0.90, 0.95)}, "accuracy", dense)
    assert mean is None
    fid = {"shoal-powersgd": {"reach_basis": "mean"}, "ddp-none": {"reach_basis": "seeds"}}
    assert report.on_mean_curve(fid, "shoal-powersgd", "ddp-none") == "; shoal-powersgd on the seeds' mean curve"
    assert report.on_mean_curve(fid, "ddp-none") == ""


def test_split_epochs(report):
    assert report.split_epochs({0: 5, 1: 6, 2: 1}, {0: 2, 1: 2, 2: 2}) == pytest.approx((5 / 3, 7 / 3))
    assert report.split_epochs({0: 5}, {0: None}) == (None, None)
    assert report.split_epochs(None, {}) == (None, None)


def test_two_phase_time_to_accuracy(report):
    """Warm-up epochs at the warm-up compressor's full-rank step, the rest at the factorized step."""
    fid = {"pufferfish": {"epochs_to_target": 4.0, "steps_per_epoch": 44.0, "warmup_epochs_to_target": 5 / 3,
                          "factorized_epochs_to_target": 7 / 3},
           "powerfish": {"epochs_to_target": 4.0, "steps_per_epoch": 44.0, "warmup_epochs_to_target": 2.0,
                         "factorized_epochs_to_target": 2.0},
           "ddp-none": {"epochs_to_target": 4.0, "steps_per_epoch": 44.0}}
    steps = {"shoal-none": 50.0, "shoal-powersgd": 30.0, "pufferfish": 20.0, "powerfish": 22.0, "ddp-none": 40.0}
    assert report.tta_s(fid, "pufferfish", steps) == pytest.approx(44 * (5 / 3 * 50 + 7 / 3 * 20) / 1e3)
    assert report.tta_s(fid, "powerfish", steps) == pytest.approx(44 * (2 * 30 + 2 * 22) / 1e3)
    assert report.tta_s(fid, "ddp-none", steps) == pytest.approx(4 * 44 * 40 / 1e3)
    # Without the warm-up's full-rank step (or the factorized one) there is no time to derive.
    assert report.tta_s(fid, "powerfish", dict(steps, **{"shoal-powersgd": None})) is None
    assert report.tta_s(fid, "pufferfish", {"shoal-none": 50.0}) is None


def test_epochs_to_target_by_hand_for_two_phase(report):
    summary = {}
    report.add_epochs(summary, None, "pufferfish_cnn/pufferfish=5:2,pufferfish_cnn/powerfish=1.5:2")
    assert summary["pufferfish_cnn"]["pufferfish"]["warmup_epochs_to_target"] == 2.0
    assert summary["pufferfish_cnn"]["pufferfish"]["factorized_epochs_to_target"] == 3.0
    assert summary["pufferfish_cnn"]["powerfish"]["warmup_epochs_to_target"] == 1.5
    assert summary["pufferfish_cnn"]["powerfish"]["factorized_epochs_to_target"] == 0.0
    with pytest.raises(SystemExit, match="give the warm-up's epochs too, as pufferfish_cnn/pufferfish=5:W"):
        report.add_epochs({}, None, "pufferfish_cnn/pufferfish=5")


def test_pufferfish_repeats(report, tmp_path, monkeypatch, capsys):
    out = str(tmp_path)
    cnn_fidelity(out)
    os.makedirs(os.path.join(out, "speed"))
    with open(os.path.join(out, "speed", "repeats"), "w") as f:
        f.write("2\n")
    task = os.path.join(out, "speed", "1gbit", "pufferfish_cnn")
    steps = [{"shoal-none": 50.0, "shoal-powersgd": 30.0, "pufferfish": 20.0, "pufferfish-fused": 18.0,
              "powerfish": 22.0, "ddp-none": 40.0, "local": 10.0, "local-factorized": 5.0},
             {"shoal-none": 60.0, "pufferfish": 25.0, "pufferfish-fused": 19.0, "powerfish": 24.0,
              "ddp-none": 45.0, "local": 12.0, "local-factorized": 6.0}]   # shoal-powersgd did not run
    for k, at in enumerate(steps):
        d = os.path.join(task, "repeat-%d" % (k + 1))
        planned(d, list(steps[0]))
        for name, ms in at.items():
            result(d, name, ms)
    monkeypatch.setattr(sys, "argv", ["report.py", out])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    # The fidelity table splits a two-phase configuration's epochs at its warm-up.
    row = next(l for l in lines if l.startswith("| pufferfish |"))
    assert "| 4.0 (1.7 full rank + 2.3 factorized) |" in row
    assert "| not reached |" in next(l for l in lines if l.startswith("| pufferfish-fused |"))
    # Both no-communication steps; pufferfish held against the factorized one: 20/5, 25/6.
    assert any(l.startswith("No communication (the same step on one rank, in every repeat; the factorized step, "
                            "local-factorized): 5.5 [5.0–6.0] ms") for l in lines)
    row = next(l for l in lines if l.startswith("| pufferfish |") and "each" not in l and "2 of 2 ok" in l)
    assert "| 1.90× [1.80–2.00] | 4.08× [4.00–4.17] |" in row
    # To dense's accuracy against DDP dense (4 epochs at 40 and 45 ms): pufferfish 5/3 epochs at
    # shoal-none's 50 / 60 ms + 7/3 at its own 20 / 25 ms: 160/130 = 1.23, 180/158.3 = 1.14.
    tta = next(l for l in lines if l.startswith("| 1gbit | pufferfish | ddp-none, time to dense's accuracy"))
    assert "| 1.23, 1.14 | 1.18× [1.14–1.23] | 2 of 2 |" in tta
    # powerfish: 2 epochs at shoal-powersgd's 30 ms + 2 at its own 22: 160/104 = 1.54; repeat 2 has
    # no shoal-powersgd run, so no value, and says which run is missing.
    tta = next(l for l in lines if l.startswith("| 1gbit | powerfish | ddp-none, time to dense's accuracy"))
    assert "| 1.54, — | 1.54× (1 of 2) | 1 of 2; repeat-2: shoal-powersgd missing: did not run |" in tta
    per_step = next(l for l in lines if l.startswith("| 1gbit | pufferfish | ddp-none, per step (this: factorized)"))
    assert "| 2.00, 1.80 |" in per_step
    fused = next(l for l in lines if l.startswith("| 1gbit | pufferfish-fused | ddp-none, time to dense's accuracy"))
    assert "not derived: no epochs to dense's accuracy for pufferfish-fused (not reached in the fidelity runs)" in fused
    assert any(l.startswith("\npufferfish, pufferfish-fused, powerfish train full rank") or
               l.startswith("pufferfish, pufferfish-fused, powerfish train full rank") for l in lines)
    # The goal: the best paired median among shoal's configurations, powerfish's 1.54×.
    assert any(l.startswith("| pufferfish_cnn, 1gbit: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner")
               and "| powerfish: 1.54× (1 of 2) (derived) | no |" in l for l in lines)
    capsys.readouterr()


def test_pufferfish_single_run(report, tmp_path, monkeypatch, capsys):
    out = str(tmp_path)
    cnn_fidelity(out)
    result(os.path.join(out, "speed", "local", "pufferfish_cnn"), "local", 10.0)
    result(os.path.join(out, "speed", "local", "pufferfish_cnn"), "local-factorized", 5.0)
    task = os.path.join(out, "speed", "1gbit", "pufferfish_cnn")
    for name, ms in (("shoal-none", 50.0), ("shoal-powersgd", 30.0), ("pufferfish", 20.0), ("powerfish", 22.0),
                     ("ddp-none", 40.0)):
        result(task, name, ms)
    monkeypatch.setattr(sys, "argv", ["report.py", out])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    assert "No communication, the factorized step (local-factorized): 5.0 ms (CPU 10.0 ms)." in lines
    # pufferfish: 44 x (5/3 x 50 + 7/3 x 20) ms = 5.72 s; powerfish 44 x (2 x 30 + 2 x 22) = 4.58 s.
    assert any(l.startswith("| 1gbit | pufferfish | 20.0 | 21.0 | 10.0 | 2.00× | 4.00× |") and "| 5.7 | ok |" in l
               for l in lines)
    assert any(l.startswith("| 1gbit | powerfish | 22.0 |") and "| 4.6 | ok |" in l for l in lines)
    assert any(l.startswith("| 1gbit | ddp-none | 40.0 |") and "| 7.0 | ok |" in l for l in lines)
    assert any(l.startswith("| pufferfish_cnn, 1gbit: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner")
               and "| powerfish: 1.54× (derived) | no |" in l for l in lines)
    # The step goal holds each step against its own no-communication step: shoal-powersgd 30/10.
    assert any(l.startswith("| pufferfish_cnn, 1gbit: best shoal step within 1.25× of no communication")
               and "| shoal-powersgd: 3.00× | no |" in l for l in lines)
    capsys.readouterr()


# ---- bytes sent per step ------------------------------------------------------------------------

def test_sent_per_step_prefers_the_runs_own_count_over_the_launchs(report, tmp_path):
    """A run's own count over its timed steps (--count-wire) is the number; the whole launch's
    wire.sh count over its steps is only the fallback for results from before it was recorded
    (it spreads the set-up's broadcast over the steps)."""
    wire = tmp_path / "shoal-powersgd.wire"
    wire.write_text(json.dumps({"hosts": [{"tx_bytes": 6_200_000}, {"tx_bytes": 6_000_000}]}))
    assert report.sent_per_step({"steps": 20, "tx_bytes_per_step": 80_000.0}, str(wire)) == 80_000.0
    assert report.sent_per_step({"steps": 20}, str(wire)) == 300_000.0          # the fewest, over 20 steps
    assert report.sent_per_step({"steps": 20}, str(tmp_path / "absent.wire")) is None


def test_recorder_counts_the_timed_steps_bytes_only(monkeypatch):
    """common.Recorder --count-wire: the bytes of the timed steps over their number; the set-up
    before the first step (5 MB here) and the first 3 steps (50 kB each) are not in it."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "train"))
    try:
        common = pytest.importorskip("common")
    finally:
        sys.path.pop(0)
    readings = [5_000_000]
    for i in range(10):
        readings.append(readings[-1] + (50_000 if i < 3 else 1_000))
    sent = iter(readings)
    monkeypatch.setattr(common, "tx_bytes", lambda: next(sent))

    class Args:
        count_wire = True
    record = common.Recorder(Args, None, "accuracy")
    for _ in range(10):
        record.timed_step(lambda: 0.0)
    stats = record.step_stats()
    assert stats["steps"] == 10 and stats["tx_bytes_per_step"] == 1_000
    assert next(sent, None) is None   # read once before the first step and once after each
    # A phase of its own (pufferfish_cnn.py's factorized steps, from step 5 on): its own steps 8..9.
    assert record.step_stats(5)["tx_bytes_per_step"] == 1_000

    # Without --count-wire nothing is read and nothing reported.
    def unread():
        raise AssertionError("tx_bytes read without --count-wire")
    monkeypatch.setattr(common, "tx_bytes", unread)
    Args.count_wire = False
    plain = common.Recorder(Args, None, "accuracy")
    for _ in range(5):
        plain.timed_step(lambda: 0.0)
    assert "tx_bytes_per_step" not in plain.step_stats()


def fidelity_result(directory, name, seed, ranks, accuracies, steps=40):
    """A fidelity run's log and rank 0's JSON: per-epoch accuracy, on `ranks` ranks."""
    os.makedirs(directory, exist_ok=True)
    key = "%s-s%d" % (name, seed)
    with open(os.path.join(directory, key + ".log"), "w") as f:
        f.write("# launcher\naccuracy=%.4f\n# exit status 0\n" % accuracies[-1])
    epochs = [{"epoch": i + 1, "loss": 1.0 / (i + 1), "accuracy": a, "train_s": 0.1 * (i + 1)}
              for i, a in enumerate(accuracies)]
    with open(os.path.join(directory, key + ".json"), "w") as f:
        json.dump({"accuracy": accuracies[-1], "identical": True, "epochs": epochs, "steps": steps,
                   "step_ms_median": 5.0, "ranks": ranks}, f)


def digits_fidelity(out, ranks):
    """Seed 0 of dense (4 epochs to its own final accuracy), PowerSGD (5) and DDP dense (4) on `ranks`."""
    fid = os.path.join(out, "fidelity", "digits_mlp")
    fidelity_result(fid, "shoal-none", 0, ranks, [0.5, 0.8, 0.9, 0.95, 0.95])
    fidelity_result(fid, "shoal-powersgd", 0, ranks, [0.5, 0.7, 0.85, 0.9, 0.95])
    fidelity_result(fid, "ddp-none", 0, ranks, [0.5, 0.8, 0.9, 0.95, 0.95])


def digits_speed_repeats(out):
    """Two repeats at 1gbit: no communication 8 ms, PowerSGD 20 ms, DDP dense 60 ms."""
    os.makedirs(os.path.join(out, "speed"))
    with open(os.path.join(out, "speed", "repeats"), "w") as f:
        f.write("2\n")
    for k in (1, 2):
        d = os.path.join(out, "speed", "1gbit", "digits_mlp", "repeat-%d" % k)
        planned(d, ["shoal-powersgd", "ddp-none", "local"])
        for name, ms in [("local", 8.0), ("shoal-powersgd", 20.0), ("ddp-none", 60.0)]:
            result(d, name, ms)


def digits_speed_single(out):
    """One run at 1gbit (no --repeats): the same steps as digits_speed_repeats."""
    result(os.path.join(out, "speed", "local", "digits_mlp"), "local", 8.0)
    for name, ms in [("shoal-powersgd", 20.0), ("ddp-none", 60.0)]:
        result(os.path.join(out, "speed", "1gbit", "digits_mlp"), name, ms)


@pytest.mark.parametrize("layout", ["repeats", "single"])
@pytest.mark.parametrize("fidelity_ranks", [2, 4])
def test_time_to_accuracy_needs_fidelity_on_as_many_ranks_as_hosts(report, tmp_path, monkeypatch, capsys,
                                                                   fidelity_ranks, layout):
    """With the batch per rank fixed, 4 ranks take twice the batch per step of 2: epochs to dense's
    accuracy measured on 2 ranks say nothing about a 4-host run, so the report derives nothing there
    and says why, in both layouts (with and without --repeats); on 4 ranks it derives (dense 4
    epochs, PowerSGD 5; steps 60 / 20 ms: 2.40x)."""
    out = str(tmp_path)
    digits_fidelity(out, fidelity_ranks)
    (digits_speed_repeats if layout == "repeats" else digits_speed_single)(out)
    monkeypatch.setattr(sys, "argv", ["report.py", out, "--hosts", "4"])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    assert any(l.startswith("### digits_mlp: fidelity (%d ranks, loopback)" % fidelity_ranks) for l in lines)
    target = next(l for l in lines if l.startswith("| digits_mlp, 1gbit: best shoal compressor reaches dense's"))
    why = "trained on 2 ranks, the speed runs on 4 hosts (run.sh --fidelity-ranks 4)"
    if fidelity_ranks == 4:
        assert "shoal-powersgd: 2.40×" in target and target.endswith("| yes |"), target
        assert why not in "\n".join(lines)
    else:
        assert why in "\n".join(lines)
        assert "2.40×" not in target and "not derived" in target, target
        if layout == "single":
            assert why in target, target
    capsys.readouterr()


def test_fidelity_from_on_the_hosts_rank_count_replaces_the_runs_own(report, tmp_path, monkeypatch, capsys):
    """OUT's own fidelity ran on 2 ranks, its speed on 4 hosts; --fidelity-from gives 4-rank runs:
    those are the ones the derived time to accuracy takes (2.40x), not nothing."""
    out, other = str(tmp_path / "out"), str(tmp_path / "other")
    digits_fidelity(out, 2)
    digits_fidelity(other, 4)
    digits_speed_repeats(out)
    monkeypatch.setattr(sys, "argv", ["report.py", out, "--hosts", "4", "--fidelity-from", other])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    target = next(l for l in lines if l.startswith("| digits_mlp, 1gbit: best shoal compressor reaches dense's"))
    assert "shoal-powersgd: 2.40×" in target and target.endswith("| yes |"), target
    capsys.readouterr()


@pytest.mark.parametrize("args, text", [
    (["--epochs", "0"], "--epochs takes a positive whole number, not '0'"),
    (["--hosts", "x"], "--hosts takes a positive whole number, not 'x'"),
    (["--fidelity-ranks", "-1"], "--fidelity-ranks takes a positive whole number, not '-1'"),
    (["--repeats", "2.5"], "--repeats takes a positive whole number, not '2.5'"),
])
def test_run_sh_refuses_a_count_that_is_not_a_whole_number(args, text):
    """bench/train/run.sh checks its counts before it starts anything (a cluster, a training run)."""
    import subprocess
    done = subprocess.run(["bash", os.path.join(ROOT, "bench", "train", "run.sh")] + args, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert text in done.stderr, done.stderr


@pytest.mark.parametrize("identical", [True, False])
def test_sketch_f32_is_judged_like_fp16_and_needs_identical_ranks(report, tmp_path, monkeypatch, capsys, identical):
    """The sketch with exact=0 (shoal-sketch-f32) gives up bit-exactness, not agreement: its row is
    held to fp16's half point and also needs every rank's parameters bit-identical."""
    out = str(tmp_path)
    fid = os.path.join(out, "fidelity", "digits_mlp")
    fidelity_result(fid, "shoal-none", 0, 4, [0.5, 0.8, 0.9, 0.95, 0.95])
    fidelity_result(fid, "shoal-sketch-f32", 0, 4, [0.5, 0.8, 0.9, 0.95, 0.948])
    if not identical:
        path = os.path.join(fid, "shoal-sketch-f32-s0.json")
        data = json.load(open(path))
        data["identical"] = False
        json.dump(data, open(path, "w"))
    monkeypatch.setattr(sys, "argv", ["report.py", out, "--hosts", "4"])
    report.main()
    lines = open(os.path.join(out, "tables.md")).read().splitlines()
    row = next(l for l in lines if l.startswith("| shoal-sketch-f32 |"))
    assert "| within 0.5, ranks identical | %s |" % ("yes" if identical else "no") in row, row
    capsys.readouterr()
