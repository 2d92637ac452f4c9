#!/usr/bin/env python3
"""Combine peer-benchmark runs into median tables (stdlib only).

Input: a manifest TSV written by run.sh, one line per benchmark invocation:
    label  nranks  rep  kind  log  json
  label   column name, e.g. "shoal", "gloo ring", "ompi tcp"
  kind    "peer"  -> log is gloo_allreduce / mpi_allreduce stdout
          "shoal" -> json is shoal-bench --json output (log is the fallback)
One configuration may span several invocations (run.sh splits the sweep so
large sizes run fewer iterations); rows are keyed by (label, nranks, rep, size).

Output: raw.tsv (every measured row), medians.tsv, and a Markdown report with
busbw and time tables per rank count, plus shoal / best-peer ratios.
"""

import argparse
import json
import math
import os
import statistics
import sys

# Column order of the report; labels not listed here are appended in the
# order first seen.
PREFERRED_ORDER = [
    "shoal",
    "gloo ring", "gloo ring_chunked", "gloo halving_doubling", "gloo bcube",
    "gloo new_ring", "gloo new_bcube",
    "ompi default", "ompi tcp",
]
SHOAL_LABEL = "shoal"
# Which shoal-bench result to compare: "oop" (out of place) or "ip".
SHOAL_PLACEMENT = os.environ.get("SHOAL_PLACEMENT", "oop")


def busbw_factor(nranks):
    """nccl-tests allreduce bus-bandwidth factor 2(n-1)/n."""
    return 2.0 * (nranks - 1) / nranks if nranks > 0 else 0.0


def make_row(size, time_us, nranks, wrong, algbw=None, busbw=None):
    """Recompute algbw/busbw from time so every tool uses one formula;
    fall back to the tool's own numbers when no time is given."""
    if time_us and time_us > 0:
        algbw = size / (time_us * 1e3)  # GB/s, GB = 1e9
        busbw = algbw * busbw_factor(nranks)
    return {"size": int(size), "time_us": time_us, "algbw": algbw,
            "busbw": busbw, "wrong": wrong}


def _num(tok):
    try:
        return float(tok)
    except (TypeError, ValueError):
        return None


def parse_table(path, nranks):
    """nccl-tests-style text rows: size count type redop [root] time algbw
    busbw #wrong [... in-place columns]. Used for our peers and as a fallback
    for shoal-bench stdout. Takes the first (out-of-place) block of a row."""
    rows = []
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return rows
    for line in lines:
        tok = line.split()
        # Launchers may prefix each line with the rank, e.g. "[0] ".
        if tok and tok[0].startswith("[") and tok[0].endswith("]"):
            tok = tok[1:]
        if not tok or tok[0].startswith("#"):
            continue
        if len(tok) < 8 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        rest = tok[4:]
        # nccl-tests prints a root column (-1 for allreduce): an integer
        # without a decimal point right after redop.
        if rest and "." not in rest[0] and len(rest) >= 5 and _num(rest[0]) is not None:
            rest = rest[1:]
        if len(rest) < 4:
            continue
        time_us, algbw, busbw = _num(rest[0]), _num(rest[1]), _num(rest[2])
        wrong = _num(rest[3])
        if time_us is None:
            continue
        rows.append(make_row(int(tok[0]), time_us, nranks,
                             None if wrong is None else int(wrong), algbw, busbw))
    return rows


def parse_shoal_json(path, nranks, placement=SHOAL_PLACEMENT):
    """shoal-bench -J: nccl-tests' schema (version 3) plus shoal's keys:
    {"config": {"collective", "nranks", ...}, "results": [{"size", "count",
    "type", "redop", "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong",
    "time_max", ...}, "in_place": {...}}]}. Also reads the older shoal-bench
    layout ("oop"/"ip" with "time_us", "algbw", "busbw", "wrong")."""
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, list):  # a bare list of results
        doc = {"results": doc}
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    n = config.get("nranks") or doc.get("nranks") or doc.get("size") or nranks
    try:
        n = int(n)
    except (TypeError, ValueError):
        n = nranks
    coll = config.get("collective") or doc.get("collective")
    if coll and str(coll).lower() not in ("allreduce", "all_reduce"):
        print(f"aggregate: warning: {path} is collective {coll!r}", file=sys.stderr)
    rows = []
    for r in doc.get("results", []):
        size = r.get("size", r.get("bytes"))
        if size is None:
            continue
        modes = {"oop": ("out_of_place", "oop"), "ip": ("in_place", "ip")}[placement]
        res = next((r[k] for k in modes + ("out_of_place", "oop") if isinstance(r.get(k), dict)), r)
        # The peers report the slowest rank's time: compare shoal's alike.
        time_us = _num(res.get("time_max", res.get("time_us", res.get("time"))))
        wrong = res.get("nwrong", res.get("wrong", res.get("#wrong")))
        rows.append(make_row(int(size), time_us, n,
                             None if wrong is None else int(wrong),
                             _num(res.get("alg_bw", res.get("algbw"))), _num(res.get("bus_bw", res.get("busbw")))))
    return rows


def read_manifest(path):
    entries = []
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            parts += [""] * (7 - len(parts))
            label, nranks, rep, kind, log, js, dack = parts[:7]
            entries.append({"label": label, "nranks": int(nranks),
                            "rep": int(rep), "kind": kind, "log": log,
                            "json": js,
                            "delayed_acks": int(dack) if dack.lstrip("-").isdigit() else None})
    return entries


def collect(entries):
    raw = []  # dicts with label, nranks, rep + row fields
    for e in entries:
        rows = []
        if e["kind"] == "shoal":
            if e["json"] and os.path.exists(e["json"]):
                try:
                    rows = parse_shoal_json(e["json"], e["nranks"])
                except (OSError, ValueError, AttributeError, TypeError) as ex:
                    print(f"aggregate: cannot parse {e['json']}: {ex}; "
                          "falling back to its stdout table", file=sys.stderr)
            if not rows:
                rows = parse_table(e["log"], e["nranks"])
        else:
            rows = parse_table(e["log"], e["nranks"])
        if not rows:
            print(f"aggregate: no results in {e['log']}", file=sys.stderr)
        for r in rows:
            raw.append(dict(r, label=e["label"], nranks=e["nranks"], rep=e["rep"]))
    return raw


def medians(raw):
    groups = {}
    for r in raw:
        groups.setdefault((r["label"], r["nranks"], r["size"]), []).append(r)
    med = {}
    for key, rs in groups.items():
        bus = [r["busbw"] for r in rs if r["busbw"] is not None]
        tim = [r["time_us"] for r in rs if r["time_us"] is not None]
        wrong = [r["wrong"] for r in rs if r["wrong"] is not None and r["wrong"] > 0]
        med[key] = {
            "busbw": statistics.median(bus) if bus else None,
            "time_us": statistics.median(tim) if tim else None,
            "reps": len(rs),
            "wrong": sum(wrong),
        }
    return med


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def fmt(v, digits=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}"


def delack_lines(entries, labels):
    """Per configuration and N: TcpExt DelayedACKs added during its runs
    (system-wide counter, summed over repeats and sweep segments)."""
    tot = {}
    for e in entries:
        if e["delayed_acks"] is not None:
            k = (e["label"], e["nranks"])
            tot[k] = tot.get(k, 0) + e["delayed_acks"]
    if not tot:
        return []
    ns = sorted({n for _, n in tot})
    out = ["", "## TCP delayed ACKs during the runs", "",
           "Increase of the host-wide TcpExt DelayedACKs counter while each "
           "configuration ran (all repeats). Large values point at "
           "delayed-ACK stalls on loopback; other jobs' traffic also counts.", "",
           "| configuration | " + " | ".join(f"N = {n}" for n in ns) + " |",
           "|---|" + "---:|" * len(ns)]
    for l in labels:
        if any((l, n) in tot for n in ns):
            out.append(f"| {l} | " + " | ".join(str(tot.get((l, n), "–")) for n in ns) + " |")
    return out


def report(med, raw, meta_lines, entries=()):
    labels_seen = []
    for r in raw:
        if r["label"] not in labels_seen:
            labels_seen.append(r["label"])
    labels = [l for l in PREFERRED_ORDER if l in labels_seen]
    labels += [l for l in labels_seen if l not in labels]
    peers = [l for l in labels if l != SHOAL_LABEL]
    have_shoal = SHOAL_LABEL in labels

    out = ["# Allreduce: shoal vs Gloo vs Open MPI (float sum, one host)", ""]
    out += meta_lines
    out += [
        "",
        "busbw = algbw · 2(n−1)/n with algbw = bytes / time, GB = 1e9; "
        "each cell is the median over repeats of one configuration. "
        "A `!` marks a cell whose runs reported wrong elements.",
    ]
    if not have_shoal:
        out += ["", "_shoal results absent (build/bin/shoalrun or shoal-bench "
                "missing, or its runs failed)._"]

    for n in sorted({r["nranks"] for r in raw}):
        sizes = sorted({r["size"] for r in raw if r["nranks"] == n})
        for metric, title, digits in (("busbw", "busbw (GB/s), higher is better", 3),
                                      ("time_us", "time (µs), lower is better", 1)):
            out += ["", f"## N = {n}: {title}", ""]
            head = ["size"] + labels
            if metric == "busbw":
                head += ["best peer"] + (["shoal / best peer"] if have_shoal else [])
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "|".join(["---:"] * len(head)) + "|")
            for s in sizes:
                cells = [fmt_size(s)]
                for l in labels:
                    m = med.get((l, n, s))
                    v = m[metric] if m else None
                    cell = fmt(v, digits)
                    if m and m["wrong"]:
                        cell += " !"
                    cells.append(cell)
                if metric == "busbw":
                    best_l, best_v = None, None
                    for l in peers:
                        m = med.get((l, n, s))
                        if m and m["busbw"] is not None and (best_v is None or m["busbw"] > best_v):
                            best_l, best_v = l, m["busbw"]
                    cells.append(f"{best_l} ({fmt(best_v, digits)})" if best_l else "–")
                    if have_shoal:
                        sm = med.get((SHOAL_LABEL, n, s))
                        ratio = (sm["busbw"] / best_v) if (sm and sm["busbw"] and best_v) else None
                        cells.append(fmt(ratio, 2) + ("×" if ratio is not None else ""))
                out.append("| " + " | ".join(cells) + " |")
    out += delack_lines(entries, labels)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--md", help="Markdown report (default OUTDIR/results.md)")
    ap.add_argument("--meta", help="file whose lines go verbatim under the title")
    args = ap.parse_args()

    entries = read_manifest(args.manifest)
    raw = collect(entries)
    if not raw:
        print("aggregate: no results at all", file=sys.stderr)
        return 1
    med = medians(raw)

    with open(os.path.join(args.outdir, "raw.tsv"), "w") as f:
        f.write("label\tnranks\trep\tsize\ttime_us\talgbw_GBps\tbusbw_GBps\twrong\n")
        for r in sorted(raw, key=lambda r: (r["nranks"], r["label"], r["rep"], r["size"])):
            f.write(f"{r['label']}\t{r['nranks']}\t{r['rep']}\t{r['size']}\t"
                    f"{fmt(r['time_us'], 2)}\t{fmt(r['algbw'], 4)}\t"
                    f"{fmt(r['busbw'], 4)}\t{'' if r['wrong'] is None else r['wrong']}\n")
    with open(os.path.join(args.outdir, "medians.tsv"), "w") as f:
        f.write("label\tnranks\tsize\treps\tmedian_time_us\tmedian_busbw_GBps\twrong\n")
        for (l, n, s), m in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            f.write(f"{l}\t{n}\t{s}\t{m['reps']}\t{fmt(m['time_us'], 2)}\t"
                    f"{fmt(m['busbw'], 4)}\t{m['wrong']}\n")

    meta = []
    if args.meta and os.path.exists(args.meta):
        with open(args.meta) as f:
            meta = [l.rstrip("\n") for l in f]
    md = report(med, raw, meta, entries)
    md_path = args.md or os.path.join(args.outdir, "results.md")
    with open(md_path, "w") as f:
        f.write(md)
    sys.stdout.write(md)
    bad = sum(m["wrong"] for m in med.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
