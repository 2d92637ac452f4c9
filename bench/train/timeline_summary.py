"""Summarizes a SHOAL_TIMELINE trace (docs/runtime.md, "Timeline"): per phase, and per tensor for
NEGOTIATE (submission to the round that took the tensor), the count, the median and the total.

    /usr/bin/python3 bench/train/timeline_summary.py trace.json [--steps N]

--steps divides the counts and totals by N to give them per step; by default N is the number of
NEGOTIATE events of the tensor that has the most (every gradient is negotiated once a step, and
the steps a run takes need not be its --max-steps). --steps 1 gives the totals of the run.
A trace from a crashed run (no closing bracket) is read too.
"""
import argparse
import json


def load(path):
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "\n]"
    return json.loads(text)


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=float, default=0.0)
    args = p.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    names = {}
    for e in load(args.trace):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    by_phase, negotiate = {}, {}
    if not events:
        print("no complete events in %s" % args.trace)
        return
    for e in events:
        by_phase.setdefault(e["name"], []).append(e["dur"])
        if e["name"] == "NEGOTIATE":
            negotiate.setdefault(names.get(e["tid"], str(e["tid"])), []).append(e["dur"])
    if args.steps <= 0:
        args.steps = float(max([len(d) for d in negotiate.values()] or [1]))
    per = "per step" if args.steps != 1.0 else "in all"
    print("%s: %.0f steps" % (args.trace, args.steps))
    print("%-26s %10s %12s %14s" % ("phase", "count " + per, "median (us)", "total (ms) " + per))
    for phase, durations in sorted(by_phase.items(), key=lambda kv: -sum(kv[1])):
        print("%-26s %10.2f %12.1f %14.3f" % (phase, len(durations) / args.steps, median(durations),
                                             sum(durations) / 1e3 / args.steps))
    # Rounds: the tensors whose NEGOTIATE ends at the same time were found ready by one round.
    rounds = {}
    for e in events:
        if e["name"] == "NEGOTIATE":
            rounds.setdefault(round(e["ts"] + e["dur"]), []).append(names.get(e["tid"], str(e["tid"])))
    sizes = {}
    for members in rounds.values():
        sizes[len(members)] = sizes.get(len(members), 0) + 1
    print("\nrounds that made tensors ready: %.2f %s; tensors per such round: %s" % (
        len(rounds) / args.steps, per, ", ".join("%d: %d" % kv for kv in sorted(sizes.items()))))
    print("\nNEGOTIATE by tensor (rank 0's submission to the round that found it ready everywhere):")
    for name, durations in sorted(negotiate.items()):
        print("  %-40s n=%-5d median %8.1f us  max %8.1f us" % (name, len(durations), median(durations),
                                                              max(durations)))


if __name__ == "__main__":
    main()
