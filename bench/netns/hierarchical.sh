#!/usr/bin/env bash
# Hierarchical against flat ring allreduce on the emulated cluster: H host namespaces with K
# ranks in each (run.sh --ranks-per-host), every host link limited to RATE, one SIZE, REPEATS
# runs of each algorithm; prints every run's time and the medians (docs/benchmarks.md,
# "Hierarchical allreduce"). Needs root; makes and removes its own namespaces. With
# --compressor NAME both runs compress (shoal-bench --compressor): the ring compresses over every
# rank, the hierarchical algorithm only across hosts (docs/groups.md). SHOAL_* variables pass
# through to the ranks: SHOAL_HIER_CHUNK_BYTES=0 runs the hierarchical legs one after another
# instead of pipelined. Prints the load average before and after (the machine may be shared).
#
#   bench/netns/hierarchical.sh [--build DIR] [--hosts H] [--per-host K] [--rate 1gbit]
#                               [--size 64M] [--repeats 3] [--iters 5] [--compressor NAME]
#                               [--shape RxC]   (one matrix instead of --size: powersgd needs one)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../../build"
hosts=2 per_host=2 rate=1gbit size=64M shape= repeats=3 iters=5
compress=()
name=shoalhier subnet=10.213.0
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --per-host) per_host="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --compressor) compress=(--compressor "$2"); shift 2 ;;
    --shape) shape="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hierarchical.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bench="$build/bin/shoal-bench"
[[ -x "$bench" ]] || { echo "hierarchical.sh: $bench not built (target shoal-bench)" >&2; exit 1; }

sizing=(-b "$size" -e "$size")
[ -n "$shape" ] && sizing=(--shape "$shape")
"$here/cluster.sh" up "$hosts" --rate "$rate" --name "$name" --subnet "$subnet" >&2 || exit $?
trap '"$here/cluster.sh" down --name "$name" >&2' EXIT
out=$(mktemp -d)
trap '"$here/cluster.sh" down --name "$name" >&2; rm -rf "$out"' EXIT
# The machine's load goes with the numbers (a shared machine: CPU-bound ranks time the CPU, not the links).
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); SHOAL_HIER_CHUNK_BYTES=${SHOAL_HIER_CHUNK_BYTES:-(default)}"
for ((i = 1; i <= repeats; i++)); do
  for algo in ring hierarchical; do
    json="$out/$algo.$i.json"
    "$here/run.sh" --name "$name" --ranks-per-host "$per_host" --timeout-s 300 \
      "$bench" allreduce "${sizing[@]}" -n "$iters" -w 1 -c 1 --algo "$algo" "${compress[@]}" -J "$json" > "$out/$algo.$i.log" 2>&1 ||
      { echo "hierarchical.sh: $algo run $i failed:" >&2; cat "$out/$algo.$i.log" >&2; exit 1; }
  done
done
# The bytes on the host links for one call of each (out-of-place and in-place: 2 calls), which
# do not depend on how busy the machine's CPUs are.
for algo in ring hierarchical; do
  "$here/wire.sh" --name "$name" "$out/$algo.wire.json" -- "$here/run.sh" --name "$name" --ranks-per-host "$per_host" \
    --timeout-s 300 "$bench" allreduce "${sizing[@]}" -n 1 -w 0 -c 0 --algo "$algo" "${compress[@]}" > "$out/$algo.wire.log" 2>&1 ||
    { echo "hierarchical.sh: $algo wire run failed:" >&2; cat "$out/$algo.wire.log" >&2; exit 1; }
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$repeats" "$hosts" "$per_host" "$rate" "${shape:-$size}" "${compress[1]:-none}" <<'PY'
import json, statistics, sys
out, repeats, hosts, per_host, rate, size, compressor = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def seconds(path):
    with open(path) as f:
        row = json.load(f)["results"][0]
    return float(row["out_of_place"]["time"]) / 1e6  # nccl-tests time: microseconds per iteration
medians = {}
for algo in ("ring", "hierarchical"):
    times = [seconds("%s/%s.%d.json" % (out, algo, i)) for i in range(1, repeats + 1)]
    medians[algo] = statistics.median(times)
    print("%-12s runs %s s, median %.3f s" % (algo, ", ".join("%.3f" % t for t in times), medians[algo]))
print("%s hosts x %s ranks at %s, %s allreduce (float sum, compressor %s): hierarchical is %.2fx the flat ring" % (
    hosts, per_host, rate, size, compressor, medians["ring"] / medians["hierarchical"]))
sent = {}
for algo in ("ring", "hierarchical"):
    with open("%s/%s.wire.json" % (out, algo)) as f:
        wire = json.load(f)
    sent[algo] = [h["tx_bytes"] for h in wire["hosts"]]
    print("%-12s bytes sent per host link for 2 calls: %s MiB" % (algo, ", ".join("%.1f" % (b / 2**20) for b in sent[algo])))
print("host-link bytes, flat ring / hierarchical: %.2f" % (max(sent["ring"]) / max(sent["hierarchical"])))
PY
