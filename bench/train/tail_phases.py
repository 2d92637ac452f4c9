"""The phases of one compressed gradient's allreduce, step by step, from a SHOAL_TIMELINE trace
(rank 0's): negotiation, start() + the call's agreement, each round's encode and payload
allreduces, the decode, and submission to done; medians and quartiles over the steps.

    /usr/bin/python3 bench/train/tail_phases.py trace.json [--tensor user.weight] [--skip 3]

Written for the NCF task (docs/training.md, "The NCF sketch step (issue 19, seventh session)"):
the sketch's host path records ENCODE (round 0: the scan), the bitmap's and the statistics'
COMPRESSED_ALLREDUCE (one since the eighth session: the statistics ride in the bitmap's),
ENCODE (round 1: the values), the values' COMPRESSED_ALLREDUCE, DECODE. Steps whose spans do not
have that shape are left out (and counted).
"""
import argparse
import statistics

from timeline_summary import load  # a timeline that may be cut short (no closing bracket)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--tensor", action="append", help="tensor names (default: user.weight and item.weight)")
    p.add_argument("--skip", type=int, default=3, help="first steps left out (warm-up)")
    args = p.parse_args()
    events = load(args.trace)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    for tensor in args.tensor or ["user.weight", "item.weight"]:
        steps, current = [], None
        for e in spans:
            if names.get(e["tid"]) != tensor:
                continue
            if e["name"] == "NEGOTIATE":
                current = [e]
                steps.append(current)
            elif current is not None:
                current.append(e)
        rows, odd = {}, 0
        for step in steps[args.skip:]:
            of = {name: [e for e in step if e["name"] == name] for name in ("QUEUE", "ENCODE", "COMPRESSED_ALLREDUCE",
                                                                          "DECODE")}
            collectives = len(of["COMPRESSED_ALLREDUCE"])
            if not of["QUEUE"] or len(of["ENCODE"]) != 2 or collectives not in (2, 3) or not of["DECODE"]:
                odd += 1
                continue
            queue, (scan, values), decode = of["QUEUE"][0], of["ENCODE"], of["DECODE"][0]
            bitmap, *stats, payload = of["COMPRESSED_ALLREDUCE"]
            row = {"negotiation": step[0]["dur"], "start() + agreement": scan["ts"] - queue["ts"] - queue["dur"],
                   "round 0: scan": scan["dur"], "index allreduce": bitmap["dur"]}
            if stats:
                row["statistics allreduce"] = stats[0]["dur"]
            row.update({"round 1: values": values["dur"], "values allreduce": payload["dur"], "decode": decode["dur"],
                        "submission to done": decode["ts"] + decode["dur"] - step[0]["ts"]})
            for key, value in row.items():
                rows.setdefault(key, []).append(value)
        n = len(rows.get("decode", []))
        print("%s: %d steps (%d of another shape left out)" % (tensor, n, odd))
        for key, values in rows.items():
            values.sort()
            print("  %-22s median %8.0f us   p25-p75 %6.0f-%.0f" % (key, statistics.median(values),
                                                                 values[len(values) // 4], values[3 * len(values) // 4]))


if __name__ == "__main__":
    main()
