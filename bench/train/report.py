#!/usr/bin/env python3
"""Tables (and, with gnuplot, plots) from bench/train/run.sh's results.

    bench/train/report.py OUT [--docs docs/training.md] [--command TEXT] [--hosts N]

Reads OUT/fidelity/<task>/<config>-s<seed>.json and OUT/speed/<rate>/<task>/<config>.json
(a run without its JSON failed: its .log says why), writes OUT/tables.md and, with --docs,
puts the same text between the "bench/train" markers of that file. Only what was measured is
reported; a goal whose runs are missing reads "not measured".
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess

BEGIN, END = "<!-- bench/train: begin -->", "<!-- bench/train: end -->"
METRIC = {"digits_mlp": "accuracy", "pufferfish_cnn": "accuracy", "embeddings": "hit_rate"}
# The fidelity goal of each configuration: the largest allowed loss against dense, in points.
GOAL_POINTS = {"shoal-fp16": 0.5, "shoal-bf16": 0.5, "shoal-topk": 0.5, "shoal-powersgd": 0.5,
               "ddp-none": 0.5, "ddp-fp16": 0.5, "pufferfish": 1.0, "powerfish": 1.0}
ORDER = ["shoal-none", "shoal-fp16", "shoal-bf16", "shoal-topk", "shoal-powersgd", "shoal-sketch", "pufferfish",
         "powerfish", "ddp-none", "ddp-fp16", "ddp-powersgd", "local"]


def order_key(name):
    return ORDER.index(name) if name in ORDER else len(ORDER)


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


def load(pattern):
    """{key: result dict or {"failed": text}} for every .log matching pattern."""
    results = {}
    for log in sorted(glob.glob(pattern)):
        path = log[:-4] + ".json"
        key = os.path.basename(log)[:-4]
        if os.path.exists(path) and os.path.getsize(path):
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
        text.append("\n### %s: fidelity (2 ranks, loopback)\n" % task)
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
                elif name in GOAL_POINTS:
                    goal = "within %.1f" % GOAL_POINTS[name]
                    met = "yes" if dm >= -GOAL_POINTS[name] else "no"
                else:
                    goal, met = "", ""
            reach = epochs_to(ok, metric, dense_ok)
            steps = [r["step_ms_median"] for r in ok.values()]
            row = "| %s | %d%s | %.4f ± %.4f | %s | %s | %s | %s | %s | %.1f |" % (
                name, len(ok), (" (%d failed)" % len(failed)) if failed else "", m, sd, against, goal, met,
                "yes" if identical else "no", reach[0], mean_sd(steps)[0])
            text.append(row)
            steps_per_epoch = [r["steps"] / len(r["epochs"]) for r in ok.values()]
            summary[task][name] = {"epochs_to_target": reach[1], "steps_per_epoch": mean_sd(steps_per_epoch)[0],
                                   "mean": m}
        if target is not None:
            text.append("\n\"Epochs to dense's accuracy\": the first epoch whose test %s reaches the final %s of "
                        "dense with the same seed less half a point, mean over seeds; \"not reached\" where some "
                        "seed never does. Dense's final mean: %.4f." % (metric, metric, target))
    return text, summary


def epochs_to(runs, metric, dense):
    """Mean over seeds of the first epoch whose metric reaches the same seed's dense final metric
    less half a point; "not reached" when some seed never gets there."""
    if not dense:
        return "—", None
    firsts = []
    for seed, r in runs.items():
        if seed not in dense:
            continue
        target = dense[seed][metric] - 0.005
        hit = [e["epoch"] for e in r["epochs"] if e[metric] >= target]
        if not hit:
            return "not reached", None
        firsts.append(hit[0])
    if not firsts:
        return "—", None
    m = sum(firsts) / len(firsts)
    return "%.1f" % m, m


def speed_tables(out, summary, hosts):
    text, targets = [], []
    local = {os.path.basename(d): load(os.path.join(d, "*.log")).get("local")
             for d in glob.glob(os.path.join(out, "speed", "local", "*"))}
    rates = sorted((os.path.basename(d) for d in glob.glob(os.path.join(out, "speed", "*"))
                    if os.path.basename(d) != "local"), key=rate_bits, reverse=True)
    for task in sorted({os.path.basename(d) for r in rates for d in glob.glob(os.path.join(out, "speed", r, "*"))}):
        limit = local.get(task)
        limit_ms = limit["step_ms_median"] if limit and "failed" not in limit else None
        text.append("\n### %s: time per step (%d hosts, one rank each)\n" % (task, hosts))
        limit_cpu = limit.get("cpu_ms_per_step") if limit_ms else None
        text.append("No communication (the same step on one rank): %s.\n" % (
            ("%.1f ms" % limit_ms + (" (CPU %.1f ms)" % limit_cpu if limit_cpu is not None else ""))
            if limit_ms else "not measured"))
        text.append("| link | configuration | step (ms, median) | mean | rank 0's CPU per step (ms) | DDP dense / this "
                    "| this / no-communication | sent per step per host (MB) | wire time at the rate (ms) "
                    "| time to dense's accuracy (s, derived) | result |")
        text.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for rate in rates:
            runs = load(os.path.join(out, "speed", rate, task, "*.log"))
            ddp = runs.get("ddp-none", {})
            ddp_ms = ddp.get("step_ms_median")
            best = None
            for name in sorted(runs, key=order_key):
                r = runs[name]
                if "failed" in r:
                    text.append("| %s | %s | | | | | | | | | failed: %s |" % (rate, name,
                                                                          r["failed"].replace("|", "/")))
                    continue
                sent = wire_bytes(os.path.join(out, "speed", rate, task, name + ".wire"))
                per_step = sent / r["steps"] if sent is not None else None
                ms = r["step_ms_median"]
                fid = summary.get(task, {}).get(name)
                tta = None
                if fid and fid["epochs_to_target"] is not None:
                    tta = fid["epochs_to_target"] * fid["steps_per_epoch"] * ms / 1e3
                cpu = r.get("cpu_ms_per_step")  # absent in results from before it was recorded
                text.append("| %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s | ok |" % (
                    rate, name, ms, r["step_ms_mean"], "%.1f" % cpu if cpu is not None else "—",
                    "%.2f×" % (ddp_ms / ms) if ddp_ms else "—",
                    "%.2f×" % (ms / limit_ms) if limit_ms else "—",
                    "%.2f" % (per_step / 1e6) if per_step is not None else "—",
                    "%.1f" % (per_step * 8 / rate_bits(rate) * 1e3) if per_step is not None and rate_bits(rate) else "—",
                    "%.1f" % tta if tta else "—"))
                if name.startswith("shoal") and (best is None or ms < best[1]):
                    best = (name, ms, tta)
            targets += speed_targets(task, rate, runs, best, ddp_ms, limit_ms, summary)
    return text, targets


def speed_targets(task, rate, runs, best, ddp_ms, limit_ms, summary):
    rows = []
    if task == "embeddings":
        sketch = runs.get("shoal-sketch", {})
        if ddp_ms and "step_ms_median" in sketch:
            x = ddp_ms / sketch["step_ms_median"]
            rows.append(("embeddings, %s: sketch ≥ 3.74× faster per step than DDP dense" % rate, "%.2f×" % x,
                         "yes" if x >= 3.74 else "no"))
        else:
            rows.append(("embeddings, %s: sketch ≥ 3.74× faster per step than DDP dense" % rate, "not measured", ""))
    else:
        ddp_fid = summary.get(task, {}).get("ddp-none")
        if best and best[2] and ddp_ms and ddp_fid and ddp_fid["epochs_to_target"]:
            ddp_tta = ddp_fid["epochs_to_target"] * ddp_fid["steps_per_epoch"] * ddp_ms / 1e3
            x = ddp_tta / best[2]
            rows.append(("%s, %s: best shoal compressor reaches dense's accuracy ≥ 1.64× sooner than DDP dense"
                         % (task, rate), "%s: %.2f× (derived)" % (best[0], x), "yes" if x >= 1.64 else "no"))
    if rate.lower() == "1gbit" and best and limit_ms:
        x = best[1] / limit_ms
        rows.append(("%s, 1gbit: best shoal step within 1.25× of no communication" % task,
                     "%s: %.2f×" % (best[0], x), "yes" if x <= 1.25 else "no"))
    return rows


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
        series = []
        for path in sorted(glob.glob(os.path.join(task_dir, "*-s0.json")), key=lambda p: order_key(
                os.path.basename(p)[:-8])):
            name = os.path.basename(path)[:-8]
            r = json.load(open(path))
            dat = os.path.join(out, "plot-%s-%s.dat" % (task, name))
            with open(dat, "w") as f:
                for e in r["epochs"]:
                    f.write("%.3f %.5f\n" % (e["train_s"], e[metric]))
            series.append("'%s' using 1:2 with linespoints title '%s'" % (dat, name))
        if not series:
            continue
        png = os.path.join(img_dir, "training_%s.png" % task)
        script = ("set terminal png size 900,500 noenhanced; set output '%s'; set key bottom right; set grid;"
                  "set xlabel 'training time (s, loopback, 2 ranks, seed 0)'; set ylabel 'test %s';"
                  "set title '%s'; plot %s" % (png, metric, task, ", ".join(series)))
        subprocess.run(["gnuplot", "-e", script], check=False)
        lines.append("\n![%s: test %s against training time](img/%s)\n" % (task, metric, os.path.basename(png)))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--docs", default=None)
    p.add_argument("--command", default="bench/train/run.sh")
    p.add_argument("--hosts", type=int, default=2)
    args = p.parse_args()

    text = ["Produced by `%s` (bench/train/report.py)." % args.command]
    machine = os.path.join(args.out, "machine.txt")
    if os.path.exists(machine):
        text.append("\nMachine and load during the runs:\n\n```\n%s```" % open(machine).read())
    fid, summary = fidelity_tables(args.out)
    text += fid
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
