#!/usr/bin/env bash
# Aggregation throughput on the emulated cluster: the dense ring against shoal-aggd in the
# switch namespace (aggregate.sh), dense and the sketch at several densities.
#
#   bench/netns/aggregate_bench.sh [--hosts 4] [--rate 1gbit] [--size 64M] [--iters 3]
#                                  [--densities "0.001 0.01 0.05"] [--repeats 1] [--out DIR]
#
# Configurations (one rank per host, shoal-bench -b SIZE -e SIZE, results checked):
#   ring_dense            SHOAL_ALGO=ring, no compressor
#   agg_dense             SHOAL_ALGO=aggregate, no compressor
#   ring_sketch_D         SHOAL_ALGO=ring, --compressor sketch on inputs of density D
#   agg_sketch_D          SHOAL_ALGO=aggregate, the same sketch (its rounds go through shoal-aggd)
# Aggregation throughput = uncompressed bytes / time (shoal-bench's out-of-place time, median
# over repeats). OUT/aggregate.md is the table, with each row's throughput as a multiple of
# ring_dense's; OUT/raw has every JSON. Needs root. Brings the cluster up and always takes
# it down (and the aggregator) on exit.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
hosts=4 rate=1gbit size=64M iters=3 repeats=1 densities="0.001 0.01 0.05"
out="$here/results/aggregate"
BIN="${SHOAL_BIN:-$repo/build/bin}"
name=aggbench

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --densities) densities=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "aggregate_bench.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for b in shoal-bench shoal-aggd; do
  [[ -x "$BIN/$b" ]] || { echo "aggregate_bench.sh: no $BIN/$b (build it, or set SHOAL_BIN)" >&2; exit 1; }
done
mkdir -p "$out/raw"
cleanup() { "$here/aggregate.sh" stop --name "$name" >/dev/null 2>&1; "$here/cluster.sh" down --name "$name" >/dev/null 2>&1; }
trap cleanup EXIT
"$here/cluster.sh" up "$hosts" --rate "$rate" --name "$name" || exit $?
export SHOAL_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export SHOAL_TIMEOUT_S=120 SHOAL_SPIN_ROUNDS=0
aggregator=$("$here/aggregate.sh" start --name "$name" --bin "$BIN") || exit 1
echo "# aggregator $aggregator in $name-sw; $hosts hosts at $rate; $size per allreduce"

configs=(ring_dense agg_dense)
for d in $densities; do configs+=("ring_sketch_$d" "agg_sketch_$d"); done
for ((rep = 0; rep < repeats; rep++)); do
  for c in "${configs[@]}"; do
    algo=ring; [[ $c == agg_* ]] && algo=aggregate
    extra=()
    [[ $c == *sketch_* ]] && extra=(--compressor sketch --density "${c##*_}")
    echo "== $c (repeat $rep)"
    SHOAL_ALGO=$algo SHOAL_AGGREGATOR=$aggregator "$here/run.sh" --name "$name" --timeout-s 400 \
      "$BIN/shoal-bench" -b "$size" -e "$size" -n "$iters" -w 1 "${extra[@]}" --json "$out/raw/$c.$rep.json" |
      grep -v "^#  Rank" || echo "FAILED: $c (repeat $rep)"
  done
done

python3 - "$out" "$hosts" "$rate" "$size" "${configs[@]}" <<'PY'
import json, glob, statistics, sys
out, hosts, rate, size, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows = {}
for c in configs:
    times, wrong, nbytes = [], 0, None
    for path in sorted(glob.glob(f"{out}/raw/{c}.*.json")):
        j = json.load(open(path))
        r = j["results"][0]
        # shoal-bench -J (nccl-tests' schema): the slowest rank's time, as the ring rows report.
        oop, ip = r["out_of_place"], r["in_place"]
        times.append(float(oop.get("time_max", oop.get("time"))))
        wrong += sum(int(m.get("nwrong") or 0) for m in (oop, ip))
        nbytes = r["size"]
    if times:
        rows[c] = (statistics.median(times), wrong, nbytes)
base = rows.get("ring_dense")
lines = [f"{hosts} hosts at {rate}, {size} f32 allreduce, shoal-aggd in the switch namespace; "
         "throughput = uncompressed bytes / time (median over repeats).", "",
         "| configuration | time (ms) | aggregation throughput (GB/s) | x ring_dense | wrong |", "|---|---|---|---|---|"]
for c in configs:
    if c not in rows:
        lines.append(f"| {c} | failed | | | |")
        continue
    t, wrong, nbytes = rows[c]
    thr = nbytes / (t * 1e-6) / 1e9
    ratio = f"{base[0] / t:.2f}" if base else "n/a"
    lines.append(f"| {c} | {t / 1e3:.1f} | {thr:.3f} | {ratio} | {wrong} |")
text = "\n".join(lines) + "\n"
open(f"{out}/aggregate.md", "w").write(text)
print(text)
PY
