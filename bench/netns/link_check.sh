#!/usr/bin/env bash
# What an emulated link lets through: 2 hosts (cluster.sh) at --rate, messages of each size sent
# after a pause (bench/netns/pingpong.py), the median time against the time at the rate.
#
#   bench/netns/link_check.sh [--rate 1gbit] [--burst auto] [--segment auto] [--sizes "80000 320000 50000000"]
#                             [--pause 0.005] [--name NAME] [--subnet A.B.C]
#
# One line per size: size, median ms, ms at the rate, and their ratio (1.0: the rate holds;
# below 1: the token bucket let part of it through faster). Needs root and iproute2.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rate=1gbit burst=auto segment=auto sizes="80000 320000 3200000 50000000" pause=0.005 name=linkchk subnet=10.213.0
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --segment) segment=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --pause) pause=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
trap '"$here/cluster.sh" down --name "$name" >/dev/null 2>&1' EXIT
"$here/cluster.sh" up 2 --rate "$rate" --burst "$burst" --segment "$segment" --name "$name" --subnet "$subnet" || exit
for size in $sizes; do
  count=21; ((size > 10000000)) && count=3
  timeout 120 ip netns exec "$name-h1" "$PYTHON" "$here/pingpong.py" recv "$subnet.1" --timeout-s 100 & receiver=$!
  line=$(timeout 120 ip netns exec "$name-h2" "$PYTHON" "$here/pingpong.py" send "$subnet.1" --size "$size" \
         --count "$count" --pause "$pause" --rate "$rate" --timeout-s 100)
  wait "$receiver"
  echo "rate=$rate burst=$burst segment=$segment ${line:-size=$size: no result}"
done
