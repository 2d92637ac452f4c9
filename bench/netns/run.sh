#!/usr/bin/env bash
# Starts a shoal job on the emulated cluster (bench/netns/cluster.sh): one rank per host
# namespace, the way shoal is started across real machines — every rank gets the store address
# of host 1 and the same token:
#
#   bench/netns/run.sh [--name NAME] [--port P] [--timeout-s S] [--ranks-per-host K] [--] prog [args...]
#
#   bench/netns/cluster.sh up 4 --rate 1gbit
#   bench/netns/run.sh build/bin/shoal-bench -b 1M -e 64M
#   bench/netns/cluster.sh down
#
# Rank r runs in namespace NAME-h(r+1) with SHOAL_RANK=r, SHOAL_WORLD_SIZE=N,
# SHOAL_LOCAL_RANK=0, SHOAL_LOCAL_SIZE=1, SHOAL_STORE=tcp://<host 1's address>:P (port 29500
# unless --port) and SHOAL_TOKEN (yours if exported, else a fresh random one). On real machines
# the same four variables, set by hand or by mpirun/srun, start the same job.
# --ranks-per-host K puts K ranks in each host namespace (ranks r*K..r*K+K-1 on host r+1, with
# SHOAL_LOCAL_RANK and SHOAL_LOCAL_SIZE=K): several ranks per host, for the hierarchical allreduce.
# Other variables in the environment (SHOAL_*, UCX_*) pass through to every rank. In the
# arguments, {rank}, {size} and {addr} (this rank's host address) are replaced per rank, which
# also starts programs that take these as flags, e.g. bench/peers' gloo_allreduce:
#   bench/netns/run.sh build/peers/gloo_allreduce --rank {rank} --size {size} --host {addr} \
#       --store-dir "$(mktemp -d)" -b 64M -e 64M
#
# Rank 0's stdout and stderr are this script's; other ranks' output goes to stderr with a
# "[r] " prefix. Every rank runs under timeout(1) (--timeout-s, default 600). When a rank fails
# the others are stopped, and the script exits with the first failure's status (124: timeout).
#
# To measure the bytes on the emulated wire, run it under wire.sh:
#   bench/netns/wire.sh bytes.json -- bench/netns/run.sh build/bin/shoal-bench -b 64M -e 64M
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=shoalnet
port=29500
limit=600
per_host=1

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --timeout-s) limit="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
(($#)) || { echo "run.sh: no program to run" >&2; usage >&2; exit 2; }

hosts_text=$("$here/cluster.sh" hosts --name "$name") || exit 1
mapfile -t hosts <<<"$hosts_text"
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --ranks-per-host needs a positive integer, not '$per_host'" >&2; exit 2; }
n=$((${#hosts[@]} * per_host))
read -r _ _ store_ip _ <<<"${hosts[0]}"
token="${SHOAL_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}"

declare -a pids
stop_all() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done; }
trap 'stop_all; exit 130' INT TERM
for ((r = n - 1; r >= 0; r--)); do
  read -r _ ns addr _ <<<"${hosts[$((r / per_host))]}"
  args=()
  for a in "$@"; do a=${a//\{rank\}/$r}; a=${a//\{size\}/$n}; args+=("${a//\{addr\}/$addr}"); done
  rank_env=(env SHOAL_RANK="$r" SHOAL_WORLD_SIZE="$n" SHOAL_LOCAL_RANK=$((r % per_host)) SHOAL_LOCAL_SIZE="$per_host"
            SHOAL_STORE="tcp://$store_ip:$port" SHOAL_TOKEN="$token")
  if ((r == 0)); then
    ip netns exec "$ns" "${rank_env[@]}" timeout -k 5 "$limit" "${args[@]}" &
  else
    ip netns exec "$ns" "${rank_env[@]}" timeout -k 5 "$limit" "${args[@]}" \
      > >(sed "s/^/[$r] /" >&2) 2>&1 &
  fi
  pids[r]=$!
done

# Wait for every rank; the first failure stops the rest. (Polled: "wait -n" cannot say
# reliably which of several ranks ended.)
exited() { [[ ! -e /proc/$1 ]] || [[ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" == Z ]]; }
status=0
declare -A running
for ((r = 0; r < n; r++)); do running[${pids[r]}]=$r; done
while ((${#running[@]})); do
  sleep 0.1
  for p in "${!running[@]}"; do
    exited "$p" || continue
    wait "$p"
    rc=$?
    r=${running[$p]}
    unset "running[$p]"
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "run.sh: rank $r exited with status $rc; stopping the others" >&2
      stop_all
    fi
  done
done
wait  # the output filters

exit "$status"
