#!/usr/bin/env bash
# Two emulated hosts (network namespaces joined by a veth pair): ranks in
# different namespaces count as different hosts, so they talk over TCP through
# the veth with UCX's peer-failure detection. Checks an exact allreduce across
# them, and that killing one rank fails the other promptly.
# Usage: netns_test.sh <bin dir>. Exits 77 (skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
a=shoal_t$$_a b=shoal_t$$_b
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
  exit 77
fi
ip link add "v$$a" type veth peer name "v$$b" || exit 1
ip link set "v$$a" netns "$a" && ip link set "v$$b" netns "$b" || exit 1
ip -n "$a" addr add 10.77.0.1/24 dev "v$$a" && ip -n "$b" addr add 10.77.0.2/24 dev "v$$b" || exit 1
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "v$$a" up && ip -n "$b" link set "v$$b" up || exit 1

export SHOAL_WORLD_SIZE=2 SHOAL_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') SHOAL_TIMEOUT_S=20
fail=0

echo "== exact allreduce across two namespaces"
export SHOAL_STORE=tcp://10.77.0.1:29611
ip netns exec "$b" env SHOAL_RANK=1 timeout 60 "$bin/shoal-bench" -b 8 -e 1M -f 32 -n 3 -w 1 >/dev/null 2>&1 &
peer=$!
ip netns exec "$a" env SHOAL_RANK=0 timeout 60 "$bin/shoal-bench" -b 8 -e 1M -f 32 -n 3 -w 1 | grep -v "#  Rank" || fail=1
wait $peer || fail=1

echo "== a rank killed in the middle of an allreduce"
export SHOAL_STORE=tcp://10.77.0.1:29612
ip netns exec "$b" env SHOAL_RANK=1 timeout 60 "$bin/rank_worker" die-mid-allreduce 1 kill >/dev/null 2>&1 &
start=$(date +%s)
ip netns exec "$a" env SHOAL_RANK=0 timeout 60 "$bin/rank_worker" die-mid-allreduce 1 kill
status=$?
elapsed=$(($(date +%s) - start))
wait
echo "survivor exit status $status after ${elapsed}s"
[ "$status" -eq 3 ] || { echo "FAIL: the survivor should report an error (exit 3)"; fail=1; }
[ "$elapsed" -lt 15 ] || { echo "FAIL: took ${elapsed}s, more than 15"; fail=1; }

[ "$fail" -eq 0 ] && echo "netns test: PASS" || echo "netns test: FAIL"
exit $fail
