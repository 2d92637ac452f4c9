#!/usr/bin/env bash
# CI smoke test of the emulated cluster (bench/netns): two hosts at 1 Gbit/s made by
# cluster.sh, one rank each started by run.sh with host 1's store address, as across real
# machines. Ranks in different namespaces count as different hosts, so they talk over TCP
# through the veths and the bridge. Checks:
#   - dense and sketch (1% density) allreduces across the hosts are exact, and the sketch puts
#     at least 3x fewer bytes on the wire than dense (eth0's counters, read by wire.sh);
#   - killing one rank in the middle of an allreduce fails the other promptly;
#   - a short message after a pause crosses the link at most ~1 ms early (the token bucket holds
#     1 ms at the rate: with the 4 ms bucket of before, 320 KB every 5 ms crossed 20x too fast);
#   - cluster.sh refuses a namespace name it did not create, and down removes all it made.
# Usage: netns_test.sh <bin dir>. Exits 77 (skipped) where network namespaces cannot be made.
set -uo pipefail
bin=$1
netns="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../bench/netns" && pwd)"
name="ct$$"
export SHOAL_NETNS_STATE_DIR="${TMPDIR:-/tmp}/shoal-netns-test.$$"
tmp=$(mktemp -d)
cleanup() { "$netns/cluster.sh" down --name "$name" >/dev/null 2>&1; rm -rf "$tmp" "$SHOAL_NETNS_STATE_DIR"; }
trap cleanup EXIT

"$netns/cluster.sh" up 2 --rate 1gbit --name "$name"
case $? in
  0) ;;
  77) echo "SKIP: cannot create network namespaces here (needs root and iproute2)"; exit 77 ;;
  *) echo "FAIL: cluster.sh up"; exit 1 ;;
esac
export SHOAL_TIMEOUT_S=20
fail=0
launch=("$netns/run.sh" --name "$name" --timeout-s 60)

# field FILE KEY.KEY...: a number or string of a JSON file (shoal-bench -J: nccl-tests' schema).
field() { python3 -c 'import functools,json,sys; print(functools.reduce(lambda d, k: d[k], sys.argv[2].split("."), json.load(open(sys.argv[1]))))' "$1" "$2"; }
tx_total() { python3 -c 'import json,sys; print(sum(h["tx_bytes"] for h in json.load(open(sys.argv[1]))["hosts"]))' "$1"; }

echo "== dense and sketch allreduce across two namespaces, 4 MiB, 1 Gbit/s"
for c in none sketch; do
  "$netns/wire.sh" --name "$name" "$tmp/$c.wire" -- "${launch[@]}" "$bin/shoal-bench" \
    -b 4M -e 4M -n 2 -w 1 --compressor "$c" --density 0.01 --json "$tmp/$c.json" | grep -v "#  Rank" ||
    { echo "FAIL: $c allreduce (non-zero exit: wrong elements or an error)"; fail=1; }
done
if [[ -s "$tmp/none.json" && -s "$tmp/sketch.json" ]]; then
  dense=$(tx_total "$tmp/none.wire") sketch=$(tx_total "$tmp/sketch.wire")
  echo "bytes sent by both hosts' eth0: dense $dense, sketch $sketch"
  [[ "$(field "$tmp/sketch.json" out_of_bounds.count)" == 0 && "$(field "$tmp/none.json" out_of_bounds.count)" == 0 ]] ||
    { echo "FAIL: wrong elements"; fail=1; }
  [[ "$(field "$tmp/sketch.json" config.error_kind)" == exact ]] || { echo "FAIL: sketch is not declared exact"; fail=1; }
  ((dense > 30000000)) || { echo "FAIL: dense sent $dense bytes, expected > 30 MB (did it use the veths?)"; fail=1; }
  ((sketch * 3 < dense)) || { echo "FAIL: the sketch did not send 3x fewer bytes than dense"; fail=1; }
else
  echo "FAIL: no JSON results"; fail=1
fi

echo "== UCX's TCP receive segment across hosts: 1 MiB for eager only, UCX's own under rendezvous, a user's wins"
# UCX logs at debug level each setting it applies to a transport ("apply UCT configuration").
# Under rendezvous (SHOAL_UCX_REMOTE_RNDV_BYTES=262144; the default 0 is eager only) shoal keeps UCX's 64 KiB
# segment (a put's first read lands in it); with 0 (eager only) it sets 1 MiB.
for run in "rndv:" "eager:" "eager:128k"; do
  rndv=${run%%:*} user=${run#*:}
  env ${user:+UCX_TCP_RX_SEG_SIZE=$user} SHOAL_UCX_REMOTE_RNDV_BYTES=$([[ $rndv == eager ]] && echo 0 || echo 262144) \
    UCX_LOG_LEVEL=debug "${launch[@]}" "$bin/shoal-bench" -b 1M -e 1M -n 1 -w 0 -c 1 >"$tmp/seg.log" 2>&1 ||
    { echo "FAIL: allreduce, $rndv, UCX_TCP_RX_SEG_SIZE=${user:-unset}"; fail=1; }
  applied=$(grep -c "apply UCT configuration RX_SEG_SIZE=" "$tmp/seg.log")
  if [[ $rndv == eager && -z "$user" ]]; then
    ((applied >= 2)) || { echo "FAIL: shoal's RX_SEG_SIZE reached UCX's TCP transport on $applied ranks, not 2"; fail=1; }
  else
    ((applied == 0)) || { echo "FAIL: shoal set RX_SEG_SIZE ($rndv, UCX_TCP_RX_SEG_SIZE=${user:-unset})"; fail=1; }
  fi
  grep -q "invalid configuration" "$tmp/seg.log" && { echo "FAIL: UCX warned: $(grep -m1 'invalid configuration' "$tmp/seg.log")"; fail=1; }
done

echo "== rendezvous into the receive buffer across hosts (endpoints through UCX's listeners)"
# describePeer (SHOAL_LOG_LEVEL=info) says so when UCX gave the endpoint a lane for remote
# memory access, which the put of a rendezvous needs; worker-address endpoints (with 0) have none.
for rndv in 262144 0; do
  env SHOAL_UCX_REMOTE_RNDV_BYTES=$rndv SHOAL_LOG_LEVEL=info "${launch[@]}" \
    "$bin/shoal-bench" -b 8M -e 8M -n 2 -w 1 -c 1 >"$tmp/rndv.log" 2>&1 ||
    { echo "FAIL: 8 MiB allreduce, SHOAL_UCX_REMOTE_RNDV_BYTES=$rndv: $(tail -2 "$tmp/rndv.log")"; fail=1; }
  inplace=$(grep "via ucx" "$tmp/rndv.log" | grep -c "rendezvous into the receive buffer")
  if [[ $rndv != 0 ]]; then
    ((inplace == 2)) || { echo "FAIL: $inplace of 2 ranks report rendezvous into the receive buffer: $(grep -m2 'via ucx' "$tmp/rndv.log")"; fail=1; }
  else
    ((inplace == 0)) || { echo "FAIL: worker-address endpoints report rendezvous into the receive buffer"; fail=1; }
  fi
done

echo "== waits for data streaming across the hosts spin briefly before they sleep"
# At 1 Gbit/s every 256 KiB segment of the ring takes ~2 ms: a wait that slept long spins only a
# few idle polls (each an epoll_wait) in the next wait before sleeping, not RemoteSpin::kFullRounds
# (50) each time (lib/transport/ucx/remote_spin.h). Each rank's transport says at debug level how
# many polls its waits spun before their first sleep, on average.
SHOAL_LOG_LEVEL=debug "${launch[@]}" "$bin/shoal-bench" -b 16M -e 16M -n 2 -w 1 -c 1 >"$tmp/spin.log" 2>&1 ||
  { echo "FAIL: 16 MiB allreduce: $(tail -2 "$tmp/spin.log")"; fail=1; }
spins=$(sed -n 's/.*waits for peers on other hosts slept, after \([0-9.]*\) idle polls.*/\1/p' "$tmp/spin.log")
echo "idle polls before sleeping, per rank: $(echo $spins)"
[[ $(echo "$spins" | grep -c .) == 2 ]] || { echo "FAIL: $(echo "$spins" | grep -c .) of 2 ranks reported their waits' sleeps"; fail=1; }
for s in $spins; do
  awk -v s="$s" 'BEGIN { exit !(s < 25) }' || { echo "FAIL: the waits spun $s idle polls before sleeping, expected < 25"; fail=1; }
done

echo "== a count that differs between the hosts, above the rendezvous threshold"
# Rank 0 allreduces 4 MiB, rank 1 8 MiB (ring segments of 256 KiB, i.e. rendezvous messages):
# they must fail with the mismatch's text (the call signature in the tag finds it), not hang on
# an unmatched rendezvous. run.sh replaces {rank} per rank.
SHOAL_UCX_REMOTE_RNDV_BYTES=262144 "${launch[@]}" bash -c 'exec "$0" -b $((4 + 4 * {rank}))M -e $((4 + 4 * {rank}))M -n 1 -w 0 -c 1' \
  "$bin/shoal-bench" >"$tmp/mismatch.log" 2>&1
status=$?
if ((status == 0)); then
  echo "FAIL: allreduces of 4 and 8 MiB across the hosts succeeded"; fail=1
elif ((status == 124)); then
  echo "FAIL: allreduces of 4 and 8 MiB across the hosts hung (run.sh's timeout)"; fail=1
elif ! grep -qiE "mismatch|do all ranks" "$tmp/mismatch.log"; then
  echo "FAIL: no mismatch text: $(tail -3 "$tmp/mismatch.log")"; fail=1
fi

echo "== SHOAL_UCX_REMOTE_RNDV_BYTES on one host only"
# Rank 1 connects through listeners, rank 0 without (the default): both fail at init with the text
# that names the variable, well before SHOAL_TIMEOUT_S (20 s), instead of rank 0 waiting for a
# connection that never comes.
start=$SECONDS
"${launch[@]}" bash -c '[[ {rank} == 1 ]] && export SHOAL_UCX_REMOTE_RNDV_BYTES=262144; exec "$0" -b 1M -e 1M -n 1 -w 0 -c 1' \
  "$bin/shoal-bench" >"$tmp/rndvmix.log" 2>&1
status=$?
elapsed=$((SECONDS - start))
if ((status == 0)); then
  echo "FAIL: ranks with and without SHOAL_UCX_REMOTE_RNDV_BYTES ran an allreduce"; fail=1
elif ! grep -q "set the same SHOAL_UCX_REMOTE_RNDV_BYTES" "$tmp/rndvmix.log"; then
  # Both ranks check; run.sh stops the other as soon as the first exits, so one text suffices.
  echo "FAIL: no rank names SHOAL_UCX_REMOTE_RNDV_BYTES: $(tail -3 "$tmp/rndvmix.log")"; fail=1
elif ((elapsed >= 15)); then
  echo "FAIL: the ranks took ${elapsed}s to fail (the deadline, not the check)"; fail=1
fi

echo "== a rank killed in the middle of an allreduce"
# Started by hand, not by run.sh (which would stop the survivor as soon as rank 1 dies).
SHOAL_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export SHOAL_WORLD_SIZE=2 SHOAL_STORE=tcp://10.211.0.1:29612 SHOAL_TOKEN
ip netns exec "$name-h2" env SHOAL_RANK=1 timeout 60 "$bin/rank_worker" die-mid-allreduce 1 kill >/dev/null 2>&1 &
start=$SECONDS
ip netns exec "$name-h1" env SHOAL_RANK=0 timeout 60 "$bin/rank_worker" die-mid-allreduce 1 kill
status=$?
elapsed=$((SECONDS - start))
wait
echo "survivor exit status $status after ${elapsed}s"
[ "$status" -eq 3 ] || { echo "FAIL: the survivor should report an error (exit 3)"; fail=1; }
[ "$elapsed" -lt 15 ] || { echo "FAIL: took ${elapsed}s, more than 15"; fail=1; }

echo "== the async runtime across the hosts (its engines sleep on the transport's events between rounds)"
if [[ -x "$bin/shoal-runtime-bench" ]]; then
  # Every rank submits 161 tensors in its own shuffled order each step: a wake-up the engine
  # missed (a peer's round, a submission) would hang it until run.sh's timeout.
  if "${launch[@]}" "$bin/shoal-runtime-bench" --shrink 16 --steps 10 --warmup 2 > "$tmp/runtime.out" 2>&1; then
    row=$(grep '^| [0-9]' "$tmp/runtime.out" | tail -1)
    idle_rounds=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $9); print $9}')
    [[ "$idle_rounds" == 0 ]] || { echo "FAIL: an idle runtime across the hosts ran rounds: $row"; fail=1; }
  else
    echo "FAIL: shoal-runtime-bench across the hosts: $(tail -3 "$tmp/runtime.out")"; fail=1
  fi
else
  echo "(shoal-runtime-bench not built: SHOAL_BUILD_BENCH=OFF; step skipped)"
fi

echo "== a short message after a pause crosses at most ~1 ms early at 1 Gbit/s"
timeout 30 ip netns exec "$name-h1" python3 "$netns/pingpong.py" recv 10.211.0.1 --timeout-s 20 & receiver=$!
ms=$(timeout 30 ip netns exec "$name-h2" python3 "$netns/pingpong.py" send 10.211.0.1 --size 320000 --pause 0.005 --timeout-s 20 |
     sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p')
wait "$receiver"
# 320 KB at 1 Gbit/s is 2.56 ms; the bucket (128 KiB) lets ~1.05 ms of it through at once.
echo "320 KB after a 5 ms pause: ${ms:-no result} ms (2.56 ms at the rate)"
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 1.3 else 1)' "${ms:-0}" ||
  { echo "FAIL: 320 KB crossed the 1 Gbit/s link in ${ms:-?} ms, under 1.3 ms: the token bucket is too deep"; fail=1; }

echo "== cluster.sh touches only what it made"
ip netns add "${name}x-h2" || { echo "FAIL: ip netns add"; fail=1; }
if "$netns/cluster.sh" up 2 --rate 1gbit --name "${name}x" 2>"$tmp/refuse.err"; then
  echo "FAIL: cluster.sh up used an existing namespace"; fail=1
  "$netns/cluster.sh" down --name "${name}x"
fi
ip netns list | grep -q "^${name}x-h2" || { echo "FAIL: the foreign namespace was removed"; fail=1; }
ip netns list | grep -q "^${name}x-sw" && { echo "FAIL: a refused cluster left its switch behind"; fail=1; }
ip netns del "${name}x-h2" 2>/dev/null
"$netns/cluster.sh" down --name "$name" || { echo "FAIL: cluster.sh down"; fail=1; }
ip netns list | grep -q "^$name-" && { echo "FAIL: namespaces left after down"; fail=1; }

[ "$fail" -eq 0 ] && echo "netns test: PASS" || echo "netns test: FAIL"
exit $fail
