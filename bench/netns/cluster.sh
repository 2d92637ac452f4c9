#!/usr/bin/env bash
# An emulated cluster on one machine: N network namespaces ("hosts") joined by
# veth pairs to a bridge, each host's link limited with tc.
#
#   bench/netns/cluster.sh up N --rate 10gbit [--delay 50us] [--burst auto] [--segment auto]
#                             [--name NAME] [--subnet 10.211.0]
#   bench/netns/cluster.sh down [--name NAME]
#   bench/netns/cluster.sh hosts [--name NAME]     one line per host: "INDEX NAMESPACE ADDRESS DEVICE"
#
# Layout (NAME defaults to "shoalnet"):
#   NAME-h1 .. NAME-hN   the hosts; each has lo and eth0 (SUBNET.K/24, K = 1..N)
#   NAME-sw              the switch: bridge br0 with one port hK per host
# Nothing is created in the namespace the script runs in: veths are made directly inside the
# namespaces, so no address, route or interface appears outside them.
#
# Links: every host's eth0 sends at most --rate (tbf) and every switch port hK sends at most
# --rate towards its host, so each host has a full-duplex link of that rate, as with a real NIC.
# --delay adds netem latency to what each host sends (one way; a round trip between two hosts
# crosses it twice). Rates and delays are tc(8) units: 1gbit, 10gbit, 50us, 1ms.
#
# --burst is the token bucket's depth, a time at the rate (250us, 4ms) or bytes (131072): what a
# host may send at the veth's own speed after a pause. A real NIC never sends faster than its
# rate, but tbf needs some depth to keep the rate while the 2 shared cores run late, so the
# default (auto) is 1 ms at the rate, at least two of the largest packets: a message after a
# pause gets at most its first ~1 ms at the veth's speed. --segment caps those packets (the
# interfaces' gso_max_size; the bucket must hold one): auto is the kernel's 64 KiB from 1 Gbit/s
# up (16 KiB packets cost this 2-core VM 5-6% of a 1 Gbit/s link in CPU), 16 KiB below it.
# Until 2026-12-03 the bucket was 4 ms deep (--burst 4ms): 320 KB after a pause then crossed a
# "1 Gbit/s" link 20x faster than 1 Gbit/s allows (docs/benchmarks.md, "The emulated link's
# burst").
#
# Ownership: "up" records every namespace it creates in STATE_DIR/NAME (default
# /run/shoal-netns; SHOAL_NETNS_STATE_DIR overrides) as soon as it exists, refuses to start if
# any of its namespace names is already taken or the cluster is already up, and "down" deletes
# only the namespaces listed there (deleting a namespace removes its veths, bridge and qdiscs).
# If "up" fails halfway it removes what it made. Needs root (CAP_SYS_ADMIN) and iproute2.
# Exit status: 0 ok, 1 failure, 2 usage, 77 network namespaces cannot be created here.
set -Eeuo pipefail

name=shoalnet
subnet=10.211.0
rate=""
delay=""
burst=auto
segment=auto
count=""
state_root="${SHOAL_NETNS_STATE_DIR:-/run/shoal-netns}"

usage() { sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "cluster.sh: $*" >&2; exit 1; }

cmd="${1:-}"
[[ -n "$cmd" ]] && shift
case "$cmd" in
  up|down|hosts) ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
if [[ "$cmd" == up ]]; then
  count="${1:-}"
  [[ "$count" =~ ^[0-9]+$ ]] && ((count >= 1 && count <= 250)) ||
    { echo "cluster.sh up: N must be a number of hosts in 1..250, not '${count}'" >&2; exit 2; }
  shift
fi
while (($#)); do
  case "$1" in
    --rate) rate="${2:?--rate needs a value}"; shift 2 ;;
    --delay) delay="${2:?--delay needs a value}"; shift 2 ;;
    --burst) burst="${2:?--burst needs a value}"; shift 2 ;;
    --segment) segment="${2:?--segment needs a value}"; shift 2 ;;
    --name) name="${2:?--name needs a value}"; shift 2 ;;
    --subnet) subnet="${2:?--subnet needs a value}"; shift 2 ;;
    *) echo "cluster.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$name" =~ ^[a-zA-Z0-9_]{1,10}$ ]] || { echo "cluster.sh: --name must be 1-10 of [a-zA-Z0-9_]" >&2; exit 2; }
[[ "$subnet" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cluster.sh: --subnet is three octets, e.g. 10.211.0" >&2; exit 2; }
state="$state_root/$name"

# Converts a tc rate ("10gbit", "500mbit", "1gbps") to bytes per second, for tbf's burst.
rate_bytes_per_s() {
  local v="${1,,}" n unit
  [[ "$v" =~ ^([0-9]+)([a-z]*)$ ]] || die "--rate '$1' is not a rate like 1gbit or 10gbit"
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case "$unit" in
    bit) echo $((n / 8)) ;; kbit) echo $((n * 1000 / 8)) ;; mbit) echo $((n * 1000000 / 8)) ;;
    gbit) echo $((n * 1000000000 / 8)) ;; bps) echo "$n" ;; kbps) echo $((n * 1000)) ;;
    mbps) echo $((n * 1000000)) ;; gbps) echo $((n * 1000000000)) ;;
    *) die "--rate '$1': unit must be bit, kbit, mbit, gbit, bps, kbps, mbps or gbps" ;;
  esac
}

down() {
  if [[ ! -f "$state/namespaces" ]]; then
    echo "cluster.sh: no cluster '$name' recorded in $state; nothing to remove"
    rm -rf "$state"
    return 0
  fi
  local ns failed=0
  while read -r ns; do
    [[ -n "$ns" ]] || continue
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then
      # Processes still inside keep it alive only as long as they run; the name goes now.
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns" || { echo "cluster.sh: could not delete namespace $ns" >&2; failed=1; }
    fi
  done <"$state/namespaces"
  ((failed)) && return 1
  rm -rf "$state"
  echo "cluster.sh: cluster '$name' removed"
}

hosts() {
  [[ -f "$state/hosts" ]] || die "no cluster '$name' is up (no $state/hosts); run: cluster.sh up N --rate R"
  cat "$state/hosts"
}

# The largest packet (bytes) the interfaces may hand to the qdisc, from --segment.
segment_bytes() {
  if [[ "$segment" == auto ]]; then
    if (($(rate_bytes_per_s "$rate") < 125000000)); then echo 16384; else echo 65536; fi
  elif [[ "$segment" =~ ^[0-9]+$ ]] && ((segment >= 1500 && segment <= 65536)); then
    echo "$segment"
  else
    die "--segment takes auto or a packet size in bytes from 1500 to 65536, not '$segment'"
  fi
}

# The token bucket's depth in bytes, from --burst: auto, a time (us, ms, s) or bytes.
burst_bytes() {
  local bps seg b
  bps=$(rate_bytes_per_s "$rate") seg=$(segment_bytes)
  case "$burst" in
    auto) b=$((bps / 1000)); ((b < 2 * seg)) && b=$((2 * seg)) ;;
    *us) [[ "${burst%us}" =~ ^[0-9]+$ ]] || die "--burst '$burst' is not a time like 250us or 4ms"
         b=$((bps * ${burst%us} / 1000000)) ;;
    *ms) [[ "${burst%ms}" =~ ^[0-9]+$ ]] || die "--burst '$burst' is not a time like 250us or 4ms"
         b=$((bps * ${burst%ms} / 1000)) ;;
    *[0-9]) [[ "$burst" =~ ^[0-9]+$ ]] || die "--burst '$burst' is not a time like 250us or bytes"; b=$burst ;;
    *) die "--burst takes auto, a time (250us, 4ms) or bytes, not '$burst'" ;;
  esac
  ((b >= seg)) || die "--burst '$burst' ($b bytes) is smaller than one packet of --segment $seg bytes: tbf would drop it"
  echo "$b"
}

# Adds the link limits to DEV in NS: tbf at the rate, behind netem when a delay is asked for;
# packets no larger than --segment.
shape() {
  local ns=$1 dev=$2 with_delay=$3 bps burst_b limit parent="root"
  bps=$(rate_bytes_per_s "$rate")
  burst_b=$(burst_bytes)
  ip -n "$ns" link set dev "$dev" gso_max_size "$(segment_bytes)"
  # queue: 20 ms past the bucket, enough for TCP to fill the pipe without drops at these RTTs.
  limit=$((burst_b + bps / 50))
  if [[ "$with_delay" == 1 && -n "$delay" ]]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000
    parent="parent 1:1"
  fi
  # shellcheck disable=SC2086  # parent is two words or one
  tc -n "$ns" qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst_b" limit "$limit"
}

# Whether this kernel has sch_netem: tried on lo of a scratch namespace that "up" made itself.
netem_available() {
  local probe="$name-probe" ok=1
  ip netns add "$probe" 2>/dev/null || return 0  # no namespaces at all: "up" reports that below
  tc -n "$probe" qdisc add dev lo root netem delay 1us 2>/dev/null || ok=0
  ip netns del "$probe"
  ((ok))
}

up() {
  [[ -n "$rate" ]] || { echo "cluster.sh up: --rate is required (e.g. --rate 10gbit)" >&2; exit 2; }
  rate_bytes_per_s "$rate" >/dev/null
  burst_bytes >/dev/null   # a bad --burst or --segment is a usage error before anything is made
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "cluster.sh: cannot create network namespaces here: ip and tc missing (apt-get install iproute2)" >&2
    exit 77
  fi
  if [[ -e "$state" ]]; then
    die "cluster '$name' is already up (see $state); run 'cluster.sh down --name $name' first"
  fi
  local sw="$name-sw" k ns
  local -a all=("$sw" "$name-probe")
  for ((k = 1; k <= count; k++)); do all+=("$name-h$k"); done
  local existing
  existing=$(ip netns list 2>/dev/null | awk '{print $1}')
  for ns in "${all[@]}"; do
    if grep -qx "$ns" <<<"$existing"; then
      die "namespace $ns exists and was not made by this cluster; refusing to touch it (pick another --name)"
    fi
  done
  mkdir -p "$state"
  : >"$state/namespaces"
  if [[ -n "$delay" ]] && ! netem_available; then
    rm -rf "$state"
    echo "cluster.sh up: --delay needs the netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks" >&2
    exit 2
  fi
  trap 'echo "cluster.sh: setup failed; removing what was made" >&2; down >&2' ERR

  # The switch namespace first: if namespaces cannot be made at all, say so with exit 77.
  if ! ip netns add "$sw" 2>"$state/err"; then
    echo "cluster.sh: cannot create network namespaces here: $(cat "$state/err") (needs root and iproute2)" >&2
    rm -rf "$state"
    exit 77
  fi
  echo "$sw" >>"$state/namespaces"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : >"$state/hosts.tmp"
  for ((k = 1; k <= count; k++)); do
    ns="$name-h$k"
    ip netns add "$ns"
    echo "$ns" >>"$state/namespaces"
    ip -n "$ns" link set lo up
    ip link add "h$k" netns "$sw" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "h$k" master br0
    ip -n "$ns" addr add "$subnet.$k/24" dev eth0
    ip -n "$sw" link set "h$k" up
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0 1
    shape "$sw" "h$k" 0
    echo "$k $ns $subnet.$k eth0" >>"$state/hosts.tmp"
  done
  {
    echo "rate=$rate"
    echo "delay=${delay:-0}"
    echo "burst_bytes=$(burst_bytes)"
    echo "segment_bytes=$(segment_bytes)"
    echo "count=$count"
  } >"$state/link"
  mv "$state/hosts.tmp" "$state/hosts"
  rm -f "$state/err"
  trap - ERR
  echo "cluster.sh: cluster '$name' up: $count hosts $subnet.1-$count, $rate per host (bucket $(burst_bytes) B, packets <= $(segment_bytes) B)${delay:+, $delay one-way delay}"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  hosts) hosts ;;
esac
