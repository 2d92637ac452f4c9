#!/usr/bin/env python3
"""Tables (and, with gnuplot, plots) from bench/train/run.sh's results.

    bench/train/report.py OUT [--docs docs/training.md] [--command TEXT] [--hosts N]
                           [--fidelity-from DIR] [--epochs-to-target SPEC]

Reads OUT/fidelity/<task>/<config>-s<seed>.json and OUT/speed/<rate>/<task>/<config>.json
(a run without its JSON failed: its .log says why), writes OUT/tables.md and, with --docs,
puts the same text between the "bench/train" markers of that file. Only what was measured is
reported; a goal whose runs are missing reads "not measured". With run.sh --repeats N the speed
results are in OUT/speed/<rate>/<task>/repeat-<k>/: each configuration is reported by its
median over the repeats and their range, each ratio paired within a repeat and then summarized
the same way, and a goal is judged on the paired median; a run that failed or never ran is
listed per repeat (see "run.sh --repeats N" below).
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess

BEGIN, END = "<!-- bench/train: begin -->", "<!-- bench/train: end -->"
METRIC = {"digits_mlp": "accuracy", "pufferfish_cnn": "accuracy", "pufferfish_mnist1d": "accuracy",
          "embeddings": "hit_rate"}
# The fidelity goal of each configuration: the largest allowed loss against dense, in points.
# shoal-sketch-f32 (the sketch with exact=0) is held to fp16's goal; its ranks must still be bit-identical.
GOAL_POINTS = {"shoal-fp16": 0.5, "shoal-bf16": 0.5, "shoal-topk": 0.5, "shoal-powersgd": 0.5, "shoal-sketch-f32": 0.5,
               "shoal-powersgd-r16": 0.5,
               "ddp-none": 0.5, "ddp-fp16": 0.5, "pufferfish": 1.0, "pufferfish-fused": 1.0,
               "powerfish": 1.0}
ORDER = ["shoal-none", "shoal-fp16", "shoal-bf16", "shoal-topk", "shoal-powersgd", "shoal-powersgd-r16", "shoal-sketch",
         "shoal-sketch-f32", "pufferfish", "pufferfish-fused", "powerfish", "ddp-none", "ddp-fp16", "ddp-powersgd",
         "local", "local-factorized"]
# pufferfish_cnn.py's configurations whose step changes mid-run: full rank for the warm-up epochs,
# then factorized. Each maps to the full-rank speed configuration of its warm-up's compressor; its
# own speed run is factorized from the first step (run.sh: --warmup-frac 0), and its step is held
# against the factorized step on one rank (local-factorized) rather than the full-rank one (local).
TWO_PHASE = {"pufferfish": "shoal-none", "pufferfish-fused": "shoal-none", "powerfish": "shoal-powersgd"}
LOCALS = ("local", "local-factorized")


def order_key(name):
    return ORDER.index(name) if name in ORDER else len(ORDER)


def is_shoal(name):
    """A configuration trained through shoal (the ones judged against the DDP peers)."""
    return name.startswith("shoal") or name in TWO_PHASE


def local_of(name):
    """The no-communication run that configuration name's step is held against."""
    return "local-factorized" if name in TWO_PHASE else "local"


def tta_s(fid, name, steps):
    """The derived seconds to dense's accuracy of configuration name, or None: fid is the task's
    fidelity summary, steps {configuration: step ms} of one run (or one repeat). A single-step
    configuration: epochs to dense's accuracy x steps per epoch x its step. A two-phase one
    (TWO_PHASE): the epochs of it that fall in the full-rank warm-up x steps per epoch x the warm-up
    compressor's full-rank step, plus the epochs after it x steps per epoch x its factorized step."""
    entry = fid.get(name)
    if not entry or entry.get("epochs_to_target") is None:
        return None
    per_epoch, own = entry["steps_per_epoch"], steps.get(name)
    if name not in TWO_PHASE:
        return entry["epochs_to_target"] * per_epoch * own / 1e3 if own else None
    warm, after = entry.get("warmup_epochs_to_target"), entry.get("factorized_epochs_to_target")
    full = steps.get(TWO_PHASE[name])
    if warm is None or after is None or not own or not full:
        return None
    return (warm * per_epoch * full + after * per_epoch * own) / 1e3


def split_epochs(firsts, warmups):
    """{seed: first epoch at dense's accuracy} and {seed: warm-up epochs} -> the mean over seeds of
    the epochs spent full rank, min(first, warm-up), and of those after it, max(0, first - warm-up);
    (None, None) without a warm-up count for every seed."""
    if not firsts or any(warmups.get(seed) is None for seed in firsts):
        return None, None
    full = [min(first, warmups[seed]) for seed, first in firsts.items()]
    after = [max(0, first - warmups[seed]) for seed, first in firsts.items()]
    return sum(full) / len(full), sum(after) / len(after)


def mean_sd(values):
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, sd


def failure(log):
    """The line of a failed run's log that says why: a C++ exception's what() first, then the
    last error-looking line."""
    if not os.path.exists(log):
        return "no log"
    lines = [re.sub(r"^\[\d+\] ", "", l.strip()) for l in open(log, errors="replace")
             if l.strip() and not l.startswith("#")]
    for pattern in (r"what\(\)|enforce fail", r"error|exception|killed|signal|needs "):
        for line in reversed(lines):
            if re.search(pattern, line, re.I):
                line = re.sub(r"(RuntimeError: )?Got the following error when running the callback: ", "", line)
                return line.strip()[:200]
    return lines[-1][:200] if lines else "no output"


# Exit statuses of timeout(1): 124 when the limit ended the command, 137 when it had to be killed.
TIME_LIMIT_STATUSES = (124, 137)


def exit_status(log):
    """The launch's exit status, from the "# exit status N" line run.sh writes last (None: none)."""
    status = None
    for line in open(log, errors="replace"):
        found = re.match(r"# exit status (\d+)\s*$", line)
        if found:
            status = int(found.group(1))
    return status


def load(pattern):
    """{key: result dict or {"failed": text}} for every .log matching pattern. A launch that exited
    with an error failed even when rank 0 had written its result first (a rank that hung or
    crashed after it): one that hit its time limit says so."""
    results = {}
    for log in sorted(glob.glob(pattern)):
        path = log[:-4] + ".json"
        key = os.path.basename(log)[:-4]
        status = exit_status(log)
        if status in TIME_LIMIT_STATUSES:
            what = "hit its time limit" if status == 124 else "was killed (SIGKILL: its time limit's kill, or another)"
            results[key] = {"failed": "%s (exit status %d)%s" % (
                what, status, "; rank 0 had written its result" if os.path.exists(path) else "")}
        elif status:
            results[key] = {"failed": "%s (exit status %d)" % (failure(log), status)}
        elif os.path.exists(path) and os.path.getsize(path):
            results[key] = json.load(open(path))
        else:
            results[key] = {"failed": failure(log)}
    return results


def fidelity_tables(out):
    text, summary = [], {}
    for task_dir in sorted(glob.glob(os.path.join(out, "fidelity", "*"))):
        task = os.path.basename(task_dir)
        metric = METRIC.get(task, "accuracy")
        runs = load(os.path.join(task_dir, "*.log"))
        by_config = {}
        for key, result in runs.items():
            name, seed = key.rsplit("-s", 1)
            by_config.setdefault(name, {})[int(seed)] = result
        dense = by_config.get("shoal-none", {})
        dense_ok = {s: r for s, r in dense.items() if "failed" not in r}
        target = mean_sd([r[metric] for r in dense_ok.values()])[0] if dense_ok else None
        ranks = sorted({r.get("ranks", 2) for r in runs.values() if "failed" not in r}) or [2]
        text.append("\n### %s: fidelity (%s ranks, loopback)\n" % (task, "/".join(map(str, ranks))))
        text.append("| configuration | seeds | final %s, mean ± sd | against dense, points (mean ± sd; max \\|Δ\\|) "
                    "| goal | met | ranks bit-identical | epochs to dense's accuracy | step (ms, median) |" % metric)
        text.append("|---|---|---|---|---|---|---|---|---|")
        summary[task] = {}
        for name in sorted(by_config, key=order_key):
            seeds = by_config[name]
            ok = {s: r for s, r in seeds.items() if "failed" not in r}
            failed = [r["failed"] for r in seeds.values() if "failed" in r]
            if not ok:
                text.append("| %s | 0 of %d | failed: %s | | | | | | |" % (name, len(seeds), failed[0]))
                continue
            values = [r[metric] for r in ok.values()]
            m, sd = mean_sd(values)
            common = sorted(set(ok) & set(dense_ok))
            diffs = [100 * (ok[s][metric] - dense_ok[s][metric]) for s in common]
            identical = all(r["identical"] for r in ok.values())
            if name == "shoal-none" or not diffs:
                against, goal, met = "—", "", ""
            else:
                dm, dsd = mean_sd(diffs)
                worst = max(abs(d) for d in diffs)
                against = "%+.2f ± %.2f; %.2f" % (dm, dsd, worst)
                if name == "shoal-sketch":
                    goal = "ranks identical, = dense"
                    same_loss = all(ok[s]["epochs"][-1]["loss"] == dense_ok[s]["epochs"][-1]["loss"] for s in common)
                    met = "yes" if identical and worst == 0 else ("identical; differs from dense by %.2f" % worst
                                                                 if identical else "no")
                    met += "; final loss %s dense's on every seed" % ("bit-equal to" if same_loss else "not equal to")
                elif name == "shoal-sketch-f32":
                    goal = "within %.1f, ranks identical" % GOAL_POINTS[name]
                    met = "yes" if dm >= -GOAL_POINTS[name] and identical else "no"
                elif name in GOAL_POINTS:
                    goal = "within %.1f" % GOAL_POINTS[name]
                    met = "yes" if dm >= -GOAL_POINTS[name] else "no"
                else:
                    goal, met = "", ""
            reach = epochs_to(ok, metric, dense_ok)
            steps = [r["step_ms_median"] for r in ok.values()]
            steps_per_epoch = [r["steps"] / len(r["epochs"]) for r in ok.values()]
            entry = {"epochs_to_target": reach[1], "steps_per_epoch": mean_sd(steps_per_epoch)[0], "mean": m,
                     "reach": reach[0], "reach_basis": reach[3],
                     "ranks": sorted({r.get("ranks", 2) for r in ok.values()})}
            reached = reach[0]
            if name in TWO_PHASE:
                full, after = split_epochs(reach[2], {s: r.get("warmup_epochs") for s, r in ok.items()})
                entry.update(warmup_epochs_to_target=full, factorized_epochs_to_target=after)
                if full is not None:
                    reached += " (%.1f full rank + %.1f factorized)" % (full, after)
            row = "| %s | %d%s | %.4f ± %.4f | %s | %s | %s | %s | %s | %.1f |" % (
                name, len(ok), (" (%d failed)" % len(failed)) if failed else "", m, sd, against, goal, met,
                "yes" if identical else "no", reached, mean_sd(steps)[0])
            text.append(row)
            summary[task][name] = entry
        if target is not None:
            text.append("\n\"Epochs to dense's accuracy\": the first epoch whose test %s reaches the final %s of "
                        "dense with the same seed less half a point, mean over seeds. Where some seed never does: the "
                        "first epoch at which the seeds' mean %s reaches the mean of their dense finals less half a "
                        "point (\"on the seeds' mean\"); \"not reached\" where that never happens either. "
                        "Dense's final mean: %.4f." % (metric, metric, metric, target))
            if any(name in TWO_PHASE for name in by_config):
                text.append("For %s: of those epochs, the mean over seeds of the ones trained full rank (the "
                            "first epoch at dense's accuracy, or the warm-up's epochs where it comes later) and "
                            "of the ones after the factorization." % ", ".join(
                                n for n in sorted(by_config, key=order_key) if n in TWO_PHASE))
    return text, summary


def epochs_to(runs, metric, dense):
    """(text, mean, {seed: epoch}, basis): the mean over seeds of the first epoch whose metric
    reaches the same seed's dense final metric less half a point, and each seed's (basis "seeds").
    Where some seed never gets there: the first epoch at which the mean over the seeds of the
    metric reaches the mean of their dense finals less half a point (basis "mean": the seeds' mean
    curve, a test set's noise on one seed no longer decides), that epoch for every seed; "not
    reached" (None, None) when the mean curve does not get there either."""
    if not dense:
        return "—", None, None, None
    firsts = {}
    for seed, r in runs.items():
        if seed not in dense:
            continue
        target = dense[seed][metric] - 0.005
        hit = [e["epoch"] for e in r["epochs"] if e[metric] >= target]
        if not hit:
            return mean_curve_epochs(runs, metric, dense, seed)
        firsts[seed] = hit[0]
    if not firsts:
        return "—", None, None, None
    m = sum(firsts.values()) / len(firsts)
    return "%.1f" % m, m, firsts, "seeds"


def mean_curve_epochs(runs, metric, dense, missed):
    """epochs_to's answer on the seeds' mean curve (seed `missed` never reached its own target)."""
    seeds = sorted(s for s in runs if s in dense)
    curves = [runs[s]["epochs"] for s in seeds]
    target = sum(dense[s][metric] for s in seeds) / len(seeds) - 0.005
    for i in range(min(len(c) for c in curves)):
        epoch = curves[0][i]["epoch"]
        if any(c[i]["epoch"] != epoch for c in curves):
            return "not reached (seed %d; the seeds' epochs differ)" % missed, None, None, None
        if sum(c[i][metric] for c in curves) / len(curves) >= target:
            return ("%d on the seeds' mean (seed %d never reaches its dense's)" % (epoch, missed), float(epoch),
                    {s: epoch for s in seeds}, "mean")
    return "not reached", None, None, None


def no_comm_text(entry):
    """'8.0 ms (CPU 10.0 ms)' for a no-communication run, or 'not measured'."""
    if not entry or "failed" in entry:
        return "not measured"
    cpu = entry.get("cpu_ms_per_step")
    return "%.1f ms" % entry["step_ms_median"] + (" (CPU %.1f ms)" % cpu if cpu is not None else "")


def two_phase_note(names):
    """How the derived time to dense's accuracy of the two-phase configurations among names is made."""
    shown = [n for n in sorted(names, key=order_key) if n in TWO_PHASE]
    if not shown:
        return []
    return ["\n%s train full rank for the warm-up epochs, then factorized; each speed run of theirs is "
            "factorized from the first step (`--warmup-frac 0`), so its step, and every per-step ratio of it, "
            "is the factorized step's, held against the factorized step on one rank (local-factorized). "
            "Their time to dense's accuracy (derived) = (their epochs to it that fall in the warm-up, from the "
            "fidelity runs) × steps per epoch × the full-rank step of the warm-up's compressor (%s) + (their "
            "remaining epochs to it) × steps per epoch × their own factorized step, both steps from the same "
            "run%s; \"not derived\" where the fidelity runs give no epochs (some seed never reached dense's "
            "accuracy) or either step is missing.\n" % (
                ", ".join(shown), "; ".join("%s: %s" % (n, TWO_PHASE[n]) for n in shown),
                " (with --repeats: the same repeat)")]


def speed_tables(out, summary, hosts):
    text, targets = [], []
    local = {os.path.basename(d): load(os.path.join(d, "*.log"))
             for d in glob.glob(os.path.join(out, "speed", "local", "*"))}
    rates = sorted((os.path.basename(d) for d in glob.glob(os.path.join(out, "speed", "*"))
                    if os.path.isdir(d) and os.path.basename(d) != "local"), key=rate_bits, reverse=True)
    for task in sorted({os.path.basename(d) for r in rates for d in glob.glob(os.path.join(out, "speed", r, "*"))
                        if os.path.isdir(d)}):
        if any(repeat_dirs(os.path.join(out, "speed", r, task)) for r in rates):  # run.sh --repeats N
            more_text, more_targets = repeat_task_tables(out, task, rates, summary, hosts)
            text += more_text
            targets += more_targets
            continue
        limits = {n: e["step_ms_median"] for n, e in local.get(task, {}).items() if "failed" not in e}
        text.append("\n### %s: time per step (%d hosts, one rank each)\n" % (task, hosts))
        text.append("No communication (the same step on one rank): %s.\n" % no_comm_text(local.get(task, {}).get(
            "local")))
        if "local-factorized" in local.get(task, {}):
            text.append("No communication, the factorized step (local-factorized): %s.\n" % no_comm_text(
                local[task]["local-factorized"]))
        text.append("| link | configuration | step (ms, median) | mean | rank 0's CPU per step (ms) | DDP dense / this "
                    "| this / no-communication | sent per step per host (MB) | wire time at the rate (ms) "
                    "| time to dense's accuracy (s, derived) | result |")
        text.append("|---|---|---|---|---|---|---|---|---|---|---|")
        fid = summary.get(task, {})
        seen, not_derived = set(), {}
        for rate in rates:
            runs = load(os.path.join(out, "speed", rate, task, "*.log"))
            seen.update(runs)
            steps = {n: r["step_ms_median"] for n, r in runs.items() if "failed" not in r}
            ddp_ms = steps.get("ddp-none")
            best_tta = best_limit = None
            for name in sorted(runs, key=order_key):
                r = runs[name]
                if "failed" in r:
                    text.append("| %s | %s | | | | | | | | | failed: %s |" % (rate, name,
                                                                          r["failed"].replace("|", "/")))
                    continue
                per_step = sent_per_step(r, os.path.join(out, "speed", rate, task, name + ".wire"))
                ms = r["step_ms_median"]
                limit_ms = limits.get(local_of(name))
                tta = tta_s(fid, name, steps)
                cpu = r.get("cpu_ms_per_step")  # absent in results from before it was recorded
                text.append("| %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s | ok |" % (
                    rate, name, ms, r["step_ms_mean"], "%.1f" % cpu if cpu is not None else "—",
                    "%.2f×" % (ddp_ms / ms) if ddp_ms else "—",
                    "%.2f×" % (ms / limit_ms) if limit_ms else "—",
                    "%.2f" % (per_step / 1e6) if per_step is not None else "—",
                    "%.1f" % (per_step * 8 / rate_bits(rate) * 1e3) if per_step is not None and rate_bits(rate) else "—",
                    ("%.1f" % tta + (" (on the seeds' mean curve)" if on_mean_curve(fid, name) else "")) if tta
                    else "—"))
                why = underivable(fid, name) if task != "embeddings" else ""
                if not tta and why:
                    not_derived.setdefault(why, []).append(name)
                if not is_shoal(name):
                    continue
                if tta and (best_tta is None or tta < best_tta[1]):
                    best_tta = (name, tta)
                if limit_ms and (best_limit is None or ms / limit_ms < best_limit[1]):
                    best_limit = (name, ms / limit_ms)
            why = next((w for w, names in not_derived.items() if "ddp-none" in names or any(map(is_shoal, names))), "")
            targets += speed_targets(task, rate, runs, best_tta, best_limit, ddp_ms, tta_s(fid, "ddp-none", steps),
                                     why)
        if not_derived:
            text.append("\nTime to dense's accuracy not derived for %s." % "; ".join(
                "%s: %s" % (", ".join(sorted(set(names), key=order_key)), why) for why, names in not_derived.items()))
        text += two_phase_note(seen)
    return text, targets


# ---- run.sh --repeats N: the speed phase N times, configurations interleaved --------------------
# Layout: OUT/speed/<rate>/<task>/repeat-<k>/<config>.{json,log,wire}, local.{json,log} (the same
# step on one rank, run in the same repeat) and `planned` (the configurations repeat k meant to
# run, one a line); OUT/speed/repeats (N). A configuration's step time is summarized by the median
# over the repeats and their range; a ratio of two configurations is taken within each repeat
# (both measured minutes apart on the same machine) and then summarized the same way, so a goal is
# judged on the paired median. A run that failed or never ran is reported, per repeat, as such.

REPEAT_PREFIX = "repeat-"
DDP_PEERS = ("ddp-none", "ddp-fp16", "ddp-powersgd")


def repeat_dirs(task_dir):
    """The repeat folders of one task at one rate (repeat-1, repeat-2, ... in number order); [] for
    the single-run layout."""
    found = []
    for d in glob.glob(os.path.join(task_dir, REPEAT_PREFIX + "*")):
        number = os.path.basename(d)[len(REPEAT_PREFIX):]
        if number.isdigit() and os.path.isdir(d):
            found.append((int(number), d))
    return [d for _, d in sorted(found)]


def expected_repeats(out):
    """N of run.sh --repeats N (OUT/speed/repeats), or 0 when it was not recorded."""
    try:
        return int(open(os.path.join(out, "speed", "repeats")).read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def load_repeats(task_dir, expected=0):
    """(repeat names, {configuration: [one entry per repeat]}) for one task at one rate. An entry is
    the run's result, {"failed": why} (its log without a result) or {"missing": why} (planned, or
    run in another repeat, but neither log nor result here; or a whole repeat that never ran)."""
    dirs = {int(os.path.basename(d)[len(REPEAT_PREFIX):]): d for d in repeat_dirs(task_dir)}
    numbers = list(range(1, max([expected] + list(dirs)) + 1))
    runs, configs = {}, set()
    for k in numbers:
        d = dirs.get(k)
        runs[k] = load(os.path.join(d, "*.log")) if d else {}
        configs.update(runs[k])
        planned = os.path.join(d, "planned") if d else ""
        if planned and os.path.exists(planned):
            configs.update(line.strip() for line in open(planned) if line.strip())
    table = {}
    for name in sorted(configs, key=order_key):
        table[name] = [runs[k].get(name, {"missing": ("did not run" if k in dirs else "repeat %d did not run" % k)})
                       for k in numbers]
    return [REPEAT_PREFIX + str(k) for k in numbers], table


def ok(entry):
    return "failed" not in entry and "missing" not in entry


def step_ms(entry):
    return entry["step_ms_median"] if ok(entry) else None


def status(entry):
    if ok(entry):
        return "ok"
    return ("failed: " + entry["failed"]) if "failed" in entry else ("missing: " + entry["missing"])


def spread(values):
    """{"median", "min", "max", "n", "of"} of the values that are not None (None: no value)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present), "n": len(present),
            "of": len(values)}


def paired(numerators, denominators, factor=1.0):
    """factor * a / b within each repeat; None where either run of the pair has no value."""
    return [factor * a / b if a is not None and b else None for a, b in zip(numerators, denominators)]


def show(s, form="%.1f", unit=""):
    """'median [min–max]', with '(n of N)' when some repeats have no value; '—' for none."""
    if s is None:
        return "—"
    text = (form + unit) % s["median"]
    if s["n"] > 1:
        text += " [%s–%s]" % (form % s["min"], form % s["max"])
    if s["n"] < s["of"]:
        text += " (%d of %d)" % (s["n"], s["of"])
    return text


def each(values, form="%.1f"):
    return ", ".join(form % v if v is not None else "—" for v in values)


def grouped(items):
    """[(repeat name, why)] as 'repeat-1, repeat-3: why; repeat-2: other', the same why once."""
    order, names = [], {}
    for name, why in items:
        if why not in names:
            order.append(why)
            names[why] = []
        names[why].append(name)
    return ["%s: %s" % (", ".join(names[why]), why) for why in order]


def runs_text(entries, names):
    """'3 of 3 ok', then each repeat that has no result and why."""
    good = sum(1 for e in entries if ok(e))
    bad = grouped([(n, status(e)) for n, e in zip(names, entries) if not ok(e)])
    return "; ".join(["%d of %d ok" % (good, len(entries))] + bad).replace("|", "/")


def on_mean_curve(fid, *configs):
    """'; X on the seeds' mean curve' for those of configs whose epochs to dense's accuracy come
    from the seeds' mean curve (epochs_to), or ""."""
    mean = [n for n in configs if fid.get(n, {}).get("reach_basis") == "mean"]
    return "; %s on the seeds' mean curve" % " and ".join(mean) if mean else ""


def underivable(fid, *configs):
    """Why the fidelity summary fid gives no time to dense's accuracy for some of configs, or ""."""
    hint = " (run.sh --fidelity, or report.py --fidelity-from / --epochs-to-target)"
    missing = [n for n in configs if n not in fid]
    if missing:
        return "no fidelity runs of %s%s" % (" or ".join(missing), hint)
    for name in configs:
        entry = fid[name]
        if entry.get("ranks_differ"):
            return entry["ranks_differ"]
        if entry.get("epochs_to_target") is None:
            return "no epochs to dense's accuracy for %s (%s in the fidelity runs)%s" % (
                name, entry.get("reach", "none"), hint)
        if name in TWO_PHASE and entry.get("warmup_epochs_to_target") is None:
            return "%s's fidelity runs do not say how many epochs were the warm-up (warmup_epochs)" % name
    return ""


def repeat_task_tables(out, task, rates, summary, hosts):
    """The speed tables and targets of one task whose results are in the repeats layout."""
    text, targets, expected = [], [], expected_repeats(out)
    ratio_rows, seen = [], set()
    for rate in rates:
        task_dir = os.path.join(out, "speed", rate, task)
        if not repeat_dirs(task_dir):
            continue
        names, table = load_repeats(task_dir, expected)
        text.append("\n### %s: time per step at %s (%d hosts, one rank each; %d repeats, configurations "
                    "interleaved)\n" % (task, rate, hosts, len(names)))
        locals_ms = {}
        for kind in LOCALS:  # local-factorized only where it was run (pufferfish_cnn)
            if kind != "local" and kind not in table:
                continue
            local = table.pop(kind, [{"missing": "no local run"}] * len(names))
            locals_ms[kind] = [step_ms(e) for e in local]
            text.append("No communication (the same step on one rank, in every repeat%s): %s ms (each repeat: %s; "
                        "%s).\n" % ("" if kind == "local" else "; the factorized step, %s" % kind,
                                    show(spread(locals_ms[kind])), each(locals_ms[kind]), runs_text(local, names)))
        none = [None] * len(names)
        ddp_ms = [step_ms(e) for e in table.get("ddp-none", [])] or none
        text.append("Medians over the repeats, [range]; ratios paired within each repeat, then their median "
                    "[range].\n")
        text.append("| configuration | step (ms) | each repeat (ms) | rank 0's CPU per step (ms) | DDP dense / this "
                    "| this / no-communication | sent per step per host (MB) | runs |")
        text.append("|---|---|---|---|---|---|---|---|")
        for name, entries in table.items():
            steps = [step_ms(e) for e in entries]
            cpu = [e.get("cpu_ms_per_step") if ok(e) else None for e in entries]
            sent = []
            for k, e in zip(names, entries):
                b = sent_per_step(e, os.path.join(task_dir, k, name + ".wire")) if ok(e) else None
                sent.append(b / 1e6 if b is not None else None)
            text.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, show(spread(steps)), each(steps), show(spread(cpu)),
                show(spread(paired(ddp_ms, steps)), "%.2f", "×"),
                show(spread(paired(steps, locals_ms.get(local_of(name), none))), "%.2f", "×"),
                show(spread(sent), "%.2f"), runs_text(entries, names)))
        # Each shoal configuration against each DDP peer, per step, and against DDP dense to dense's accuracy.
        fid = summary.get(task, {})
        by_repeat = [{n: step_ms(entries[k]) for n, entries in table.items()} for k in range(len(names))]
        best_tta = best_limit = None
        for name in [n for n in table if is_shoal(n)]:
            steps = [step_ms(e) for e in table[name]]
            for peer in DDP_PEERS:
                if peer not in table:
                    continue
                peer_steps = [step_ms(e) for e in table[peer]]
                ratios = paired(peer_steps, steps)
                ratio_rows.append((rate, name, "%s, per step%s" % (peer, " (this: factorized)" if name in TWO_PHASE
                                                                      else ""),
                                   ratios, pairs_text(ratios, names, table, name, peer)))
                why = underivable(fid, name, peer)
                if why and peer == "ddp-none" and task != "embeddings":
                    ratio_rows.append((rate, name, "ddp-none, time to dense's accuracy (derived)", None,
                                       "not derived: " + why))
                if not why:
                    tta = []
                    for at in by_repeat:
                        a, b = tta_s(fid, peer, at), tta_s(fid, name, at)
                        tta.append(a / b if a and b else None)
                    more = [TWO_PHASE[name]] if name in TWO_PHASE and TWO_PHASE[name] in table else []
                    ratio_rows.append((rate, name, "%s, time to dense's accuracy (derived%s)" % (
                        peer, on_mean_curve(fid, name, peer)), tta, pairs_text(tta, names, table, name, peer, *more)))
                    s = spread(tta)
                    if peer == "ddp-none" and s and (best_tta is None or s["median"] > best_tta[1]["median"]):
                        best_tta = (name, s)
            s = spread(paired(steps, locals_ms.get(local_of(name), none)))
            if s and (best_limit is None or s["median"] < best_limit[1]["median"]):
                best_limit = (name, s)
        targets += repeat_targets(task, rate, table, ddp_ms, best_tta, best_limit, len(names))
        seen.update(table)
    if ratio_rows:
        text.append("\n### %s: paired ratios against the DDP peers\n" % task)
        text.append("Each ratio is the peer's step (or time to dense's accuracy) over the shoal configuration's, "
                    "taken within each repeat; above 1: shoal is faster.\n")
        text.append("| link | shoal configuration | against | each repeat | median [range] | pairs |")
        text.append("|---|---|---|---|---|---|")
        for rate, name, against, ratios, pairs in ratio_rows:
            if ratios is None:
                text.append("| %s | %s | %s | — | — | %s |" % (rate, name, against, pairs))
            else:
                text.append("| %s | %s | %s | %s | %s | %s |" % (rate, name, against, each(ratios, "%.2f"),
                                                                 show(spread(ratios), "%.2f", "×"), pairs))
    text += two_phase_note(seen)
    return text, targets


def pairs_text(ratios, names, table, name, peer, *more):
    """'3 of 3', then for each repeat without a pair which of the runs (the two; more: others the
    value needs) lacks a result."""
    have = sum(1 for r in ratios if r is not None)
    lacking = []
    for k, r in enumerate(ratios):
        if r is None:
            why = ["%s %s" % (n, status(table[n][k])) for n in (name, peer) + more if not ok(table[n][k])]
            lacking.append((names[k], ", ".join(why) or "no value"))
    return "; ".join(["%d of %d" % (have, len(ratios))] + grouped(lacking)).replace("|", "/")


def repeat_targets(task, rate, table, ddp_ms, best_tta, best_limit, repeats):
    """The issue's speed goals, judged on paired medians over the repeats."""
    rows = []
    if task == "embeddings":
        goal = "embeddings, %s: sketch ≥ 3.74× faster per step than DDP dense (paired median, %d repeats)" % (
            rate, repeats)
        s = spread(paired(ddp_ms, [step_ms(e) for e in table.get("shoal-sketch", [])]))
        rows.append((goal, show(s, "%.2f", "×") if s else "not measured",
                     ("yes" if s["median"] >= 3.74 else "no") if s else ""))
    else:
        goal = ("%s, %s: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner than DDP dense "
                "(paired median, %d repeats)" % (task, rate, repeats))
        if best_tta:
            rows.append((goal, "%s: %s (derived)" % (best_tta[0], show(best_tta[1], "%.2f", "×")),
                         "yes" if best_tta[1]["median"] >= 1.64 else "no"))
        else:
            rows.append((goal, "not derived (no fidelity epochs, or no pair)", ""))
    if rate.lower() == "1gbit":
        goal = "%s, 1gbit: best shoal step within 1.25× of no communication (paired median, %d repeats)" % (
            task, repeats)
        if best_limit:
            rows.append((goal, "%s: %s" % (best_limit[0], show(best_limit[1], "%.2f", "×")),
                         "yes" if best_limit[1]["median"] <= 1.25 else "no"))
        else:
            rows.append((goal, "not measured", ""))
    return rows


def speed_targets(task, rate, runs, best_tta, best_limit, ddp_ms, ddp_tta, why_not_derived=""):
    """The issue's speed goals from single runs: best_tta (configuration, derived seconds to dense's
    accuracy) and best_limit (configuration, step / its no-communication step) among shoal's;
    why_not_derived says why a time to dense's accuracy is missing, if one is."""
    rows = []
    if task == "embeddings":
        sketch = runs.get("shoal-sketch", {})
        if ddp_ms and "step_ms_median" in sketch:
            x = ddp_ms / sketch["step_ms_median"]
            rows.append(("embeddings, %s: sketch ≥ 3.74× faster per step than DDP dense" % rate, "%.2f×" % x,
                         "yes" if x >= 3.74 else "no"))
        else:
            rows.append(("embeddings, %s: sketch ≥ 3.74× faster per step than DDP dense" % rate, "not measured", ""))
    elif best_tta and ddp_tta:
        x = ddp_tta / best_tta[1]
        rows.append(("%s, %s: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner than DDP dense"
                     % (task, rate), "%s: %.2f× (derived)" % (best_tta[0], x), "yes" if x >= 1.64 else "no"))
    else:
        rows.append(("%s, %s: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner than DDP dense"
                     % (task, rate), "not derived" + (": " + why_not_derived if why_not_derived else ""), ""))
    if rate.lower() == "1gbit" and best_limit:
        rows.append(("%s, 1gbit: best shoal step within 1.25× of no communication" % task,
                     "%s: %.2f×" % best_limit, "yes" if best_limit[1] <= 1.25 else "no"))
    return rows


def sent_per_step(result, wire_path):
    """Bytes a host sent per step: the run's own count over its timed steps (tx_bytes_per_step,
    --count-wire) where it has one; else, for runs from before it was recorded, the whole launch's
    (wire.sh) over its steps, which spreads the set-up's traffic over them (too high for short runs)."""
    if result.get("tx_bytes_per_step") is not None:
        return result["tx_bytes_per_step"]
    sent = wire_bytes(wire_path)
    return sent / result["steps"] if sent is not None and result.get("steps") else None


def wire_bytes(path):
    """The fewest bytes a host's interface sent during a run (bench/netns/wire.sh), or None: rank 0's host
    also sends the initial parameter broadcast, the others only their share of the steps."""
    if not os.path.exists(path):
        return None
    try:
        hosts = json.load(open(path))["hosts"]
    except (ValueError, KeyError):
        return None
    return min(h["tx_bytes"] for h in hosts)


def rate_bits(rate):
    m = re.match(r"(\d+)([kmg]?)bit", rate.lower())
    return int(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0


def plots(out, img_dir):
    """Accuracy against training wall-clock time per configuration (fidelity runs, seed 0)."""
    if not shutil.which("gnuplot"):
        return ["\nPlots: not drawn (gnuplot is not installed: apt-get install gnuplot-nox).\n"]
    os.makedirs(img_dir, exist_ok=True)
    lines = []
    for task_dir in sorted(glob.glob(os.path.join(out, "fidelity", "*"))):
        task = os.path.basename(task_dir)
        metric = METRIC.get(task, "accuracy")
        series, ranks = [], set()
        for path in sorted(glob.glob(os.path.join(task_dir, "*-s0.json")), key=lambda p: order_key(
                os.path.basename(p)[:-8])):
            name = os.path.basename(path)[:-8]
            r = json.load(open(path))
            ranks.add(r.get("ranks", 2))
            dat = os.path.join(out, "plot-%s-%s.dat" % (task, name))
            with open(dat, "w") as f:
                for e in r["epochs"]:
                    f.write("%.3f %.5f\n" % (e["train_s"], e[metric]))
            series.append("'%s' using 1:2 with linespoints title '%s'" % (dat, name))
        if not series:
            continue
        png = os.path.join(img_dir, "training_%s.png" % task)
        script = ("set terminal png size 900,500 noenhanced; set output '%s'; set key bottom right; set grid;"
                  "set xlabel 'training time (s, loopback, %s ranks, seed 0)'; set ylabel 'test %s';"
                  "set title '%s'; plot %s" % (png, "/".join(map(str, sorted(ranks))), metric, task,
                                               ", ".join(series)))
        subprocess.run(["gnuplot", "-e", script], check=False)
        lines.append("\n![%s: test %s against training time](img/%s)\n" % (task, metric, os.path.basename(png)))
    return lines


def add_epochs(summary, fidelity_from, spec):
    """Adds epochs to dense's accuracy to the fidelity summary where OUT's own runs have none: from
    another OUT's fidelity runs, then from SPEC ("task/config=epochs,..."; steps per epoch as the
    task's other configurations have, since they share data and batch, else 1: the ratios only need
    them equal; given by hand, they replace the runs'). Returns where they came from, or "" (nothing added)."""
    sources = []
    if fidelity_from:
        _, other = fidelity_tables(fidelity_from)
        added = 0
        for task, configs in other.items():
            for name, entry in configs.items():
                own = summary.setdefault(task, {}).get(name)
                if own is None or own.get("ranks_differ"):  # none, or on another rank count than the hosts
                    summary[task][name] = entry
                    added += 1
        if added:
            sources.append("the fidelity runs in %s" % fidelity_from)
    given = [item.strip() for item in spec.split(",") if item.strip()]
    for item in given:
        m = re.match(r"^([\w-]+)/([\w-]+)=([0-9.]+)(?::([0-9.]+))?$", item)
        if not m:
            raise SystemExit("report.py: --epochs-to-target takes task/config=epochs items (a two-phase "
                             "configuration, %s: task/config=epochs:warm-up epochs), not %r"
                             % ("/".join(TWO_PHASE), item))
        task, name, epochs = m.group(1), m.group(2), float(m.group(3))
        if name in TWO_PHASE and m.group(4) is None:
            raise SystemExit("report.py: --epochs-to-target %s: %s trains full rank for its warm-up, then "
                             "factorized; give the warm-up's epochs too, as %s/%s=%g:W (pufferfish_cnn.py's "
                             "default: 2 of 8 epochs)" % (item, name, task, name, epochs))
        configs = summary.setdefault(task, {})
        known = [e["steps_per_epoch"] for e in configs.values() if e.get("steps_per_epoch")]
        entry = configs.setdefault(name, {"steps_per_epoch": known[0] if known else 1.0, "mean": None})
        entry["epochs_to_target"] = epochs
        entry["reach"] = "%g, given" % epochs
        entry.pop("ranks", None)  # given by hand: whoever gives them answers for the rank count
        entry.pop("ranks_differ", None)
        if name in TWO_PHASE:  # the mean's split, as the runs' per-seed split cannot be had from it
            warmup = float(m.group(4))
            entry["warmup_epochs_to_target"] = min(epochs, warmup)
            entry["factorized_epochs_to_target"] = max(0.0, epochs - warmup)
    if given:
        sources.append("--epochs-to-target %s" % spec)
    return " and ".join(sources)


def keep_epochs_of_hosts(summary, hosts):
    """Drops the epochs to dense's accuracy of fidelity runs on another number of ranks than the
    speed runs' hosts: with the same batch per rank, N ranks train on N times the batch per step,
    so their epochs (and steps per epoch) are not the speed runs' (given epochs have no count)."""
    for configs in summary.values():
        for name, entry in configs.items():
            ranks = entry.get("ranks")
            if ranks and ranks != [hosts]:
                entry["epochs_to_target"] = None
                entry["ranks_differ"] = ("the fidelity runs of %s trained on %s ranks, the speed runs on %d hosts "
                                         "(run.sh --fidelity-ranks %d)" % (name, "/".join(map(str, ranks)), hosts,
                                                                           hosts))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--docs", default=None)
    p.add_argument("--command", default="bench/train/run.sh")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--fidelity-from", default=None, metavar="DIR",
                   help="another run.sh OUT whose fidelity runs give the epochs to dense's accuracy (for the "
                        "derived time to it) where OUT has none")
    p.add_argument("--epochs-to-target", default="", metavar="SPEC",
                   help="epochs to dense's accuracy given by hand, e.g. "
                        "'digits_mlp/ddp-none=5.7,digits_mlp/shoal-powersgd=6.0' (docs/training.md's fidelity table)")
    args = p.parse_args()

    text = ["Produced by `%s` (bench/train/report.py)." % args.command]
    machine = os.path.join(args.out, "machine.txt")
    if os.path.exists(machine):
        text.append("\nMachine and load during the runs:\n\n```\n%s```" % open(machine).read())
    fid, summary = fidelity_tables(args.out)
    text += fid
    keep_epochs_of_hosts(summary, args.hosts)  # OUT's own, before --fidelity-from may replace them
    sources = add_epochs(summary, args.fidelity_from, args.epochs_to_target)
    if sources:
        text.append("\nTime to dense's accuracy (derived) takes the epochs to it from %s." % sources)
    keep_epochs_of_hosts(summary, args.hosts)  # and those that came from elsewhere
    speed, targets = speed_tables(args.out, summary, args.hosts)
    text += speed
    if targets:
        text.append("\n### Targets\n")
        text.append("| target | measured | met |")
        text.append("|---|---|---|")
        text += ["| %s | %s | %s |" % t for t in targets]
    img_dir = os.path.join(os.path.dirname(os.path.abspath(args.docs)), "img") if args.docs else \
        os.path.join(args.out, "img")
    text += plots(args.out, img_dir)
    body = "\n".join(text) + "\n"
    with open(os.path.join(args.out, "tables.md"), "w") as f:
        f.write(body)
    if args.docs:
        doc = open(args.docs).read() if os.path.exists(args.docs) else ""
        if BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN) + len(BEGIN)] + "\n" + body + doc[doc.index(END):]
        else:
            doc += "\n%s\n%s%s\n" % (BEGIN, body, END)
        with open(args.docs, "w") as f:
            f.write(doc)
    print(body)


if __name__ == "__main__":
    main()
