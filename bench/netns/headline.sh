#!/usr/bin/env bash
# The headline benchmark: shoal, Gloo and Open MPI allreduce on an emulated cluster of network
# namespaces (cluster.sh), dense and compressed, with the bytes measured at the interfaces.
#
#   bench/netns/headline.sh [--size 256M] [--rates "1gbit 10gbit"] [--hosts 4] [--repeats 3]
#                           [--iters 2] [--densities "0.001 0.01 0.05"] [--overlap 0.5]
#                           [--only LIST] [--no-loopback] [--no-docs] [--quick] [--out DIR]
#                           [--name NAME] [--subnet A.B.C] [--burst B] [--segment S]
#
# For each rate it brings up --hosts namespaces at that rate, then runs every configuration
# --repeats times, interleaved (repeat loop outermost), one rank per host:
#   shoal            dense shoal-bench allreduce, shoal's defaults
#   shoal_tcp        the same with UCX tuned for TCP links (SHOAL_NET_ENV below)
#   gloo             Gloo ring_chunked (bench/peers/gloo_allreduce), in place
#   ompi             Open MPI, pml ob1 + btl tcp (bench/peers/mpi_allreduce via mpirun)
#   fp16             shoal-bench --compressor fp16                         (with SHOAL_NET_ENV)
#   topk_D, sketch_D shoal-bench --compressor topk ratio=D / sketch on inputs of density D
#   resnet_none, resnet_powersgd   resnet50-bench, the 161 ResNet-50 gradients, none / rank 4
#   agg_dense, agg_sketch_D        SHOAL_ALGO=aggregate: shoal-aggd in the switch namespace
#                                  (aggregate.sh), dense / the sketch at density D (with SHOAL_NET_ENV)
# --only takes a comma list of these names (topk / sketch select every density).
# Sparse inputs: each rank has a fraction D of nonzeros, a fraction --overlap of them at
# positions common to every rank (the frequent rows of an embedding), the rest private.
#
# Then (unless --no-loopback) the one-host loopback sweep of bench/peers/run.sh at N = --hosts,
# and finally report.py and plot.sh: bench/netns/results/{headline.json,headline.md,
# loopback_medians.tsv}, docs/img/*.png, and the tables between the "headline" markers of
# docs/benchmarks.md (unless --no-docs). Raw logs and per-run JSON go to OUT/raw (default
# OUT = bench/netns/results; raw/ is not committed). With --no-docs the plots go to OUT/img.
#
# Needs root (network namespaces), and scripts/setup.sh --peers for Gloo, Open MPI and gnuplot.
# Builds shoal-bench, resnet50-bench and the peer programs if they are missing. Every launch
# runs under a timeout; the cluster is removed on exit, also after a failure or Ctrl-C.
# --quick: 4 MiB, 1 repeat, 1 iteration, no loopback sweep, no docs (a minute; for trying it).
# --burst, --segment: the links' token bucket and largest packet (cluster.sh; default auto).
# --name, --subnet: the cluster's namespaces (NAME-h1..) and addresses (default headline, 10.212.0).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
size=256M
rates="1gbit 10gbit"
hosts=4
repeats=3
iters=2
densities="0.001 0.01 0.05"
overlap=0.5
only=""
loopback=1
docs=1
out="$here/results"
cluster=headline
link_args=()
subnet=10.212.0
: "${RUN_TIMEOUT:=400}"   # seconds per launch
# shoal's UCX defaults already suit TCP links between hosts (eager sends, lib/transport/ucx);
# for the compressed runs and `shoal dense (TCP env)` a waiting rank also yields its core at once
# (the kernel's TCP, veth and tc work needs the 2 cores that 4 ranks share).
SHOAL_NET_ENV="${SHOAL_NET_ENV:-SHOAL_SPIN_ROUNDS=0}"
BIN="${SHOAL_BIN:-$repo/build/bin}"
PEERS="${PEERS_BIN:-$repo/build/peers}"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
command_line="bench/netns/headline.sh $*"
while (($#)); do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --densities) densities=$2; shift 2 ;;
    --overlap) overlap=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-loopback) loopback=0; shift ;;
    --no-docs) docs=0; shift ;;
    --out) out=$2; shift 2 ;;
    --name) cluster=$2; shift 2 ;;
    --burst) link_args+=(--burst "$2"); shift 2 ;;
    --segment) link_args+=(--segment "$2"); shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --quick) size=4M; repeats=1; iters=1; loopback=0; docs=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "headline.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
want() { [[ -z "$only" || ",$only," == *",$1,"* || ",$only," == *",${1%%_*},"* ]]; }

[[ "$(id -u)" -eq 0 ]] || { echo "headline.sh: needs root (network namespaces)" >&2; exit 1; }
for tool in ip tc mpirun gnuplot python3; do
  command -v "$tool" >/dev/null ||
    { echo "headline.sh: $tool missing; run scripts/setup.sh --peers" >&2; exit 1; }
done
if [[ ! -x "$BIN/shoal-bench" || ! -x "$BIN/resnet50-bench" ]]; then
  echo "headline.sh: building shoal-bench and resnet50-bench in $repo/build"
  cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build "$repo/build" --target shoal-bench resnet50-bench || exit 1
fi
if [[ ! -x "$PEERS/gloo_allreduce" || ! -x "$PEERS/mpi_allreduce" ]]; then
  "$repo/bench/peers/build.sh" "$PEERS" || exit 1
fi

raw="$out/raw"
mkdir -p "$raw"
manifest="$out/raw/manifest.tsv"
printf 'rate\tconfig\trep\tkind\tcalls\tlog\twire\tjson\n' >"$manifest"
stop_cluster() {
  "$here/aggregate.sh" stop --name "$cluster" >/dev/null 2>&1
  "$here/cluster.sh" down --name "$cluster" >/dev/null
}
trap 'stop_cluster; exit 130' INT TERM
trap stop_cluster EXIT
"$here/cluster.sh" down --name "$cluster" >/dev/null  # leftovers of an interrupted run

read -r -a net_env <<<"$SHOAL_NET_ENV"
start=$SECONDS
load_start="$(cut -d" " -f1-3 /proc/loadavg)"
failures=0

# run_one RATE CONFIG REP KIND CALLS command...: runs it under wire.sh, records it.
run_one() {
  local rate=$1 config=$2 rep=$3 kind=$4 calls=$5; shift 5
  local tag="${rate}_${config}_r${rep}" t0=$SECONDS rc=0
  local log="$raw/$tag.log" wire="$raw/$tag.wire.json" json=""
  [[ "$kind" == shoal ]] && json="$raw/$tag.json"
  rm -f "$json"
  if [[ "$kind" == shoal ]]; then
    "$here/wire.sh" --name "$cluster" "$wire" -- "$@" --json "$json" >"$log" 2>&1 || rc=$?
  else
    "$here/wire.sh" --name "$cluster" "$wire" -- "$@" >"$log" 2>&1 || rc=$?
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$rate" "$config" "$rep" "$kind" "$calls" "$log" "$wire" "$json" >>"$manifest"
  printf 'headline.sh: [%5ds] %-7s %-16s rep %s: %3ds%s\n' $((SECONDS - start)) "$rate" "$config" "$rep" \
    $((SECONDS - t0)) "$( ((rc)) && echo " FAILED rc=$rc (see $log)")"
  ((rc)) && failures=$((failures + 1))
  return 0
}

launch=("$here/run.sh" --name "$cluster" --timeout-s "$RUN_TIMEOUT")
bench_args=(-b "$size" -e "$size" -n "$iters" -w 1)
shoal_calls=$((2 * (iters + 2)))   # out-of-place and in-place: warm-up, timed, checked
peer_calls=$((iters + 2))
hostlist=""
for ((k = 1; k <= hosts; k++)); do hostlist+="${hostlist:+,}$subnet.$k"; done

for rate in $rates; do
  "$here/cluster.sh" up "$hosts" --rate "$rate" --name "$cluster" --subnet "$subnet" "${link_args[@]}" || exit 1
  aggregator=""
  if want agg || [[ ",$only," == *",agg_"* ]]; then  # --only agg_dense etc. need the aggregator too
    export SHOAL_TOKEN="${SHOAL_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
    aggregator=$("$here/aggregate.sh" start --name "$cluster" --bin "$BIN") || failures=$((failures + 1))
  fi
  for ((rep = 1; rep <= repeats; rep++)); do
    if want shoal; then
      run_one "$rate" shoal "$rep" shoal "$shoal_calls" "${launch[@]}" "$BIN/shoal-bench" "${bench_args[@]}"
    fi
    if want shoal_tcp; then
      run_one "$rate" shoal_tcp "$rep" shoal "$shoal_calls" env "${net_env[@]}" "${launch[@]}" \
        "$BIN/shoal-bench" "${bench_args[@]}"
    fi
    if want gloo; then
      store=$(mktemp -d "${TMPDIR:-/tmp}/shoal-gloo.XXXXXX")
      run_one "$rate" gloo "$rep" peer "$peer_calls" "${launch[@]}" "$PEERS/gloo_allreduce" \
        --rank '{rank}' --size '{size}' --host '{addr}' --store-dir "$store" --algo ring_chunked "${bench_args[@]}"
      rm -rf "$store"
    fi
    if want ompi; then
      # mpirun runs on host 1 and starts its daemons in the other namespaces through
      # mpi_agent.sh instead of ssh; TCP only, on eth0, as between real machines.
      run_one "$rate" ompi "$rep" peer "$peer_calls" env SHOAL_NETNS_NAME="$cluster" \
        ip netns exec "$cluster-h1" timeout -k 5 "$RUN_TIMEOUT" mpirun --allow-run-as-root \
        --mca plm_rsh_agent "$here/mpi_agent.sh" -H "$hostlist" -np "$hosts" \
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
        "$PEERS/mpi_allreduce" "${bench_args[@]}"
    fi
    if want fp16; then
      run_one "$rate" fp16 "$rep" shoal "$shoal_calls" env "${net_env[@]}" "${launch[@]}" \
        "$BIN/shoal-bench" "${bench_args[@]}" --compressor fp16
    fi
    for d in $densities; do
      sparse=(--density "$d" --overlap "$overlap")
      if want "topk_$d"; then
        run_one "$rate" "topk_$d" "$rep" shoal "$shoal_calls" env "${net_env[@]}" "${launch[@]}" \
          "$BIN/shoal-bench" "${bench_args[@]}" --compressor topk --copts "ratio=$d" "${sparse[@]}"
      fi
      if want "sketch_$d"; then
        run_one "$rate" "sketch_$d" "$rep" shoal "$shoal_calls" env "${net_env[@]}" "${launch[@]}" \
          "$BIN/shoal-bench" "${bench_args[@]}" --compressor sketch "${sparse[@]}"
      fi
    done
    if [[ -n "$aggregator" ]]; then
      agg_env=(env "${net_env[@]}" SHOAL_ALGO=aggregate SHOAL_AGGREGATOR="$aggregator")
      want agg_dense && run_one "$rate" agg_dense "$rep" shoal "$shoal_calls" "${agg_env[@]}" "${launch[@]}" \
        "$BIN/shoal-bench" "${bench_args[@]}"
      for d in $densities; do
        want "agg_sketch_$d" && run_one "$rate" "agg_sketch_$d" "$rep" shoal "$shoal_calls" "${agg_env[@]}" \
          "${launch[@]}" "$BIN/shoal-bench" "${bench_args[@]}" --compressor sketch --density "$d" --overlap "$overlap"
      done
    fi
    for c in none powersgd; do
      want "resnet_$c" || continue
      copts=(); [[ $c == powersgd ]] && copts=(--copts rank=4)
      run_one "$rate" "resnet_$c" "$rep" resnet $((iters + 1)) env "${net_env[@]}" "${launch[@]}" \
        "$BIN/resnet50-bench" --compressor "$c" "${copts[@]}" --steps "$iters" --warmup 1
    done
  done
  "$here/aggregate.sh" stop --name "$cluster"
  "$here/cluster.sh" down --name "$cluster"
done

load="$(cut -d' ' -f1-3 /proc/loadavg)"
{
  echo "command=$command_line"
  echo "finished=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine=$(hostname), $(nproc) CPUs, $(uname -r)"
  echo "load_at_start=$load_start"
  echo "load_at_end=$load"
  echo "size=$size"
  echo "hosts=$hosts"
  echo "repeats=$repeats"
  echo "iters=$iters"
  echo "overlap=$overlap"
  echo "net_env=$SHOAL_NET_ENV"
  echo "gloo=$(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null)"
  echo "ompi=$(mpirun --version 2>/dev/null | head -n1)"
} >"$raw/meta.txt"
echo "headline.sh: emulated-cluster runs done in $((SECONDS - start)) s, $failures failure(s)"

if ((loopback)); then
  # One host, loopback/shared memory: the same programs, swept over message sizes. (run.sh
  # looks for the peer programs in its output folder.)
  mkdir -p "$raw/loopback"
  ln -sf "$PEERS/gloo_allreduce" "$PEERS/mpi_allreduce" "$raw/loopback/"
  bash "$repo/bench/peers/run.sh" --no-build -o "$raw/loopback" -N "$hosts" -r "$repeats" -b 4K -e 64M \
    --gloo-algos ring_chunked || failures=$((failures + 1))
  [[ -s "$raw/loopback/medians.tsv" ]] && cp "$raw/loopback/medians.tsv" "$out/loopback_medians.tsv"
fi

mkdir -p "$out"
python3 "$here/report.py" --manifest "$manifest" --meta "$raw/meta.txt" --out "$out" || exit 1
img="$repo/docs/img"
((docs)) || img="$out/img"  # a trial run leaves the documented plots alone
"$here/plot.sh" "$out" "$img" || failures=$((failures + 1))
if ((docs)); then
  python3 "$here/report.py" --splice "$out/headline.md" "$repo/docs/benchmarks.md" || exit 1
fi
echo "headline.sh: wrote $out/headline.md, $out/headline.json; plots in $img; $failures failure(s)"
((failures == 0))
