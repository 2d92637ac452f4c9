#!/usr/bin/env bash
# shoal-aggd in the switch namespace of an emulated cluster (cluster.sh), where a programmable
# switch's aggregation would run: its port to each host is that host's rate-limited link.
#
#   bench/netns/aggregate.sh start [--name NAME] [--port P] [--bin DIR] [-- shoal-aggd options]
#   bench/netns/aggregate.sh stop [--name NAME]
#
# start gives the bridge br0 of NAME-sw the address SUBNET.254 (SUBNET from host 1's address),
# starts DIR/shoal-aggd (default build/bin) there on port P (default 29600) with the exported
# SHOAL_TOKEN (required: run.sh passes the same one to the ranks), waits until it listens and
# prints the value for SHOAL_AGGREGATOR, e.g. tcp://10.211.0.254:29600. stop ends that
# shoal-aggd (deleting a namespace would not) and removes the address.
#
#   bench/netns/cluster.sh up 4 --rate 1gbit
#   export SHOAL_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
#   export SHOAL_AGGREGATOR=$(bench/netns/aggregate.sh start) SHOAL_ALGO=aggregate
#   bench/netns/run.sh build/bin/shoal-bench -b 64M -e 64M
#   bench/netns/aggregate.sh stop; bench/netns/cluster.sh down
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=shoalnet
port=29600
bin="$here/../../build/bin"
state_root="${SHOAL_NETNS_STATE_DIR:-/run/shoal-netns}"

usage() { sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
cmd="${1:-}"
[[ -n "$cmd" ]] && shift
case "$cmd" in
  start|stop) ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
while (($#)); do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "aggregate.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
state="$state_root/$name"
sw="$name-sw"
pidfile="$state/aggd.pid"
[[ -f "$state/hosts" ]] || { echo "aggregate.sh: no cluster '$name' is up (cluster.sh up first)" >&2; exit 1; }
read -r _ _ host1 _ < "$state/hosts"
address="${host1%.*}.254"

if [[ "$cmd" == stop ]]; then
  if [[ -f "$pidfile" ]]; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  fi
  ip -n "$sw" addr del "$address/24" dev br0 2>/dev/null || true
  exit 0
fi

[[ -n "${SHOAL_TOKEN:-}" ]] || { echo "aggregate.sh: export SHOAL_TOKEN first (the ranks need the same one)" >&2; exit 2; }
[[ -x "$bin/shoal-aggd" ]] || { echo "aggregate.sh: no $bin/shoal-aggd; build it (--target shoal-aggd) or pass --bin" >&2; exit 1; }
[[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null &&
  { echo "aggregate.sh: shoal-aggd already runs for '$name' (pid $(cat "$pidfile")); stop it first" >&2; exit 1; }
ip -n "$sw" addr add "$address/24" dev br0 2>/dev/null || true
log="$state/aggd.log"
ip netns exec "$sw" "$bin/shoal-aggd" --listen "$address:$port" "$@" >"$log" 2>&1 &
echo $! >"$pidfile"
for _ in $(seq 100); do
  grep -q "listening on" "$log" 2>/dev/null && { echo "tcp://$address:$port"; exit 0; }
  kill -0 "$(cat "$pidfile")" 2>/dev/null || break
  sleep 0.05
done
echo "aggregate.sh: shoal-aggd did not start:" >&2
cat "$log" >&2
exit 1
