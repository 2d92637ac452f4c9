#!/usr/bin/env bash
# Smoke test of in-network aggregation on the emulated cluster (bench/netns): two hosts at
# 1 Gbit/s, shoal-aggd in the switch namespace (aggregate.sh), one rank per host. Checks that
# dense and sketch (1% density) allreduces through the aggregator are exact (shoal-bench checks
# every element), and that with the aggregator stopped every rank fails within SHOAL_TIMEOUT_S.
# Usage: netns_aggregate_test.sh <bin dir>. Exits 77 (skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
netns="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../bench/netns" && pwd)"
name="ag$$"
export SHOAL_NETNS_STATE_DIR="${TMPDIR:-/tmp}/shoal-netns-agg.$$"
tmp=$(mktemp -d)
cleanup() {
  "$netns/aggregate.sh" stop --name "$name" >/dev/null 2>&1
  "$netns/cluster.sh" down --name "$name" >/dev/null 2>&1
  rm -rf "$tmp" "$SHOAL_NETNS_STATE_DIR"
}
trap cleanup EXIT

"$netns/cluster.sh" up 2 --rate 1gbit --name "$name"
case $? in
  0) ;;
  77) echo "SKIP: cannot create network namespaces here (needs root and iproute2)"; exit 77 ;;
  *) echo "FAIL: cluster.sh up"; exit 1 ;;
esac
export SHOAL_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export SHOAL_TIMEOUT_S=10 SHOAL_ALGO=aggregate
SHOAL_AGGREGATOR=$("$netns/aggregate.sh" start --name "$name" --bin "$bin") || { echo "FAIL: aggregate.sh start"; exit 1; }
export SHOAL_AGGREGATOR
echo "aggregator: $SHOAL_AGGREGATOR"
fail=0
field() { python3 -c 'import functools,json,sys; print(functools.reduce(lambda d, k: d[k], sys.argv[2].split("."), json.load(open(sys.argv[1]))))' "$1" "$2"; }

for c in none sketch; do
  echo "== $c allreduce through the aggregator, 4 MiB"
  "$netns/run.sh" --name "$name" --timeout-s 60 "$bin/shoal-bench" -b 4M -e 4M -n 2 -w 1 --compressor "$c" \
    --density 0.01 --json "$tmp/$c.json" | grep -v "#  Rank" || { echo "FAIL: $c (non-zero exit)"; fail=1; }
  [[ -s "$tmp/$c.json" && "$(field "$tmp/$c.json" out_of_bounds.count)" == 0 ]] || { echo "FAIL: $c: wrong elements or no result"; fail=1; }
done

echo "== the aggregator stopped: every rank fails"
"$netns/aggregate.sh" stop --name "$name"
# What this run tests is that the deadline fires and the error names the aggregator: a
# short deadline (the runs above keep 10 s) tests the same in 7 s less.
dead_timeout_s=3
start=$SECONDS
if SHOAL_TIMEOUT_S=$dead_timeout_s "$netns/run.sh" --name "$name" --timeout-s 60 "$bin/shoal-bench" -b 1M -e 1M -n 1 -w 0 >"$tmp/dead.out" 2>&1; then
  echo "FAIL: allreduces succeeded without the aggregator"; fail=1
fi
elapsed=$((SECONDS - start))
grep -q "aggregator" "$tmp/dead.out" || { echo "FAIL: the error does not name the aggregator:"; cat "$tmp/dead.out"; fail=1; }
((elapsed < dead_timeout_s + 15)) || { echo "FAIL: took ${elapsed}s with SHOAL_TIMEOUT_S=$dead_timeout_s"; fail=1; }
echo "failed after ${elapsed}s: $(grep -m1 aggregator "$tmp/dead.out")"

[ "$fail" -eq 0 ] && echo "netns aggregate test: PASS" || echo "netns aggregate test: FAIL"
exit $fail
