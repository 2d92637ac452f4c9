#!/usr/bin/env bash
# What a waiting rank costs: CPU seconds of shoal and Gloo ranks during a large allreduce on
# an emulated cluster (cluster.sh), and shoal's small-message latency across the emulated
# link, for the current build and, optionally, another libshoal (before/after a change).
#
#   bench/netns/wait_cpu.sh [--hosts 2] [--rate 1gbit] [--size 64M] [--iters 4] [--repeats 3]
#                           [--before DIR] [--before-env 'VAR=VALUE ...'] [--bin DIR] [--peers DIR] [--out FILE]
#                           [--name NAME] [--subnet A.B.C] [--port P] [--no-lat]
#
# --before DIR: a directory holding another libshoal.so.0, loaded instead of the build's through
# LD_LIBRARY_PATH (shoal-bench's RUNPATH comes after it), run as configuration "shoal_before".
# --before-env 'VAR=VALUE ...': shoal_before is the same build with these variables set (say
# SHOAL_UCX_REMOTE_RNDV_BYTES=0); with --before, both apply.
# Configurations, interleaved (repeat loop outermost), one rank per host:
#   shoal, shoal_before   shoal-bench -b SIZE -e SIZE -n ITERS -w 1 (out of place and in place)
#   gloo                  bench/peers/gloo_allreduce --algo ring_chunked, same size
#   lat, lat_before       shoal-bench -b 8 -e 64K -f 8 -n 200 -w 20: time per call (µs)
# (--no-lat leaves the lat runs out.)
# For each large configuration, wire.sh's "command_cpu_seconds" (user + system of every rank)
# of a run with ITERS iterations minus one with 1 (start-up cancels out), per extra allreduce
# call (shoal-bench makes 2 per iteration, out of place and in place; Gloo 1) and per wall
# second, and the machine's idle share during the longer run (/proc/stat; other jobs count).
# Needs root; the cluster (--name, default cpuwait; --subnet, default 10.213.0; the store on
# --port, default 29517) is removed on exit.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
hosts=2 rate=1gbit size=64M iters=4 repeats=3 before="" before_env="" out="" name=cpuwait subnet=10.213.0 port=29517 latency=1
BIN="$repo/build/bin" PEERS="$repo/build/peers"
while (($#)); do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --before-env) before_env=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --peers) PEERS=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --no-lat) latency=0; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wait_cpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$(id -u)" -eq 0 ]] || { echo "wait_cpu.sh: needs root" >&2; exit 1; }
tmp=$(mktemp -d)
cleanup() { "$here/cluster.sh" down --name "$name" >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
"$here/cluster.sh" up "$hosts" --rate "$rate" --name "$name" --subnet "$subnet" >/dev/null || exit 1
launch=("$here/run.sh" --name "$name" --port "$port" --timeout-s 300)
results="$tmp/results.tsv"

# Start-up (UCX, connections) costs CPU too: each configuration runs twice, with ITERS timed
# iterations and with 1, and the difference (CPU and wall) is what the extra calls cost.
big() {  # config calls_per_iteration cmd... (the command's last argument is the iteration count)
  local config=$1 per=$2; shift 2
  local -a cmd=("$@")
  local n=${cmd[-1]}
  unset 'cmd[-1]'
  # (Gloo's FileStore directory is emptied before each run: stale keys would confuse it.)
  if ! { rm -rf "$tmp"/store*/*; "$here/wire.sh" --name "$name" "$tmp/long.json" -- "${cmd[@]}" "$n" >"$tmp/$config.log" 2>&1; } ||
     ! { rm -rf "$tmp"/store*/*; "$here/wire.sh" --name "$name" "$tmp/short.json" -- "${cmd[@]}" 1 >>"$tmp/$config.log" 2>&1; }; then
    echo "wait_cpu.sh: $config failed:" >&2; tail -5 "$tmp/$config.log" >&2; return
  fi
  python3 - "$tmp/long.json" "$tmp/short.json" "$config" $((per * (n - 1))) >>"$results" <<'EOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3]); calls = int(sys.argv[4])
cpu = lambda w: w["command_cpu_seconds"]["user"] + w["command_cpu_seconds"]["system"]
wall = a["seconds"] - b["seconds"]; c = cpu(a) - cpu(b)
j = a["cpu_jiffies"]
print(f"{sys.argv[3]}\t{wall:.3f}\t{c:.3f}\t{c / calls:.4f}\t{c / max(wall, 1e-3):.3f}\t{100.0 * j['idle'] / max(1, j['total']):.1f}")
EOF
}
lat() {  # config cmd...
  local config=$1; shift
  if ! "$@" >"$tmp/$config.log" 2>&1; then
    echo "wait_cpu.sh: $config failed:" >&2; tail -5 "$tmp/$config.log" >&2; return
  fi
  # shoal-bench rows: size count type redop root time(out of place) ...; keep size and time.
  awk -v c="$config" '$1 ~ /^[0-9]+$/ && NF > 6 { print c "\t" $1 "\t" $6 }' "$tmp/$config.log" | sort -u >>"$tmp/lat.tsv"
}

bench=("$BIN/shoal-bench" -b "$size" -e "$size" -w 1 -n "$iters")
# How shoal_before runs: another library, other variables, or both.
before_cmd=(env ${before:+LD_LIBRARY_PATH="$before"} $before_env)
[[ -n "$before" || -n "$before_env" ]] && have_before=1 || have_before=0
for ((rep = 1; rep <= repeats; rep++)); do
  big shoal 2 "${launch[@]}" "${bench[@]}"
  ((have_before)) && big shoal_before 2 "${before_cmd[@]}" "${launch[@]}" "${bench[@]}"
  if [[ -x "$PEERS/gloo_allreduce" ]]; then
    mkdir -p "$tmp/store$rep"
    big gloo 1 "${launch[@]}" "$PEERS/gloo_allreduce" --rank '{rank}' --size '{size}' --host '{addr}' \
      --store-dir "$tmp/store$rep" --algo ring_chunked -b "$size" -e "$size" -w 1 -n "$iters"
  fi
  ((latency)) && lat lat "${launch[@]}" "$BIN/shoal-bench" -b 8 -e 64K -f 8 -n 200 -w 20
  ((latency)) && ((have_before)) && lat lat_before "${before_cmd[@]}" "${launch[@]}" "$BIN/shoal-bench" -b 8 -e 64K -f 8 -n 200 -w 20
done

report() {
  echo "# wait_cpu.sh: $hosts hosts at $rate, $size allreduce, $iters iterations (+ warm-up, checked), $repeats repeats; $(date -u '+%F %H:%M UTC')"
  echo
  echo "| configuration | runs | wall s of the extra calls | CPU s of the extra calls, all ranks | CPU s per allreduce | cores busy (CPU s / wall s) | machine idle % (longer run) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  python3 - "$results" <<'EOF'
import statistics, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, *v = line.split("\t"); rows[c].append([float(x) for x in v])
for c, vs in rows.items():
    med = [statistics.median(col) for col in zip(*vs)]
    print(f"| {c} | {len(vs)} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.3f} | {med[3]:.2f} | {med[4]:.0f} |")
EOF
  if [[ -s "$tmp/lat.tsv" ]]; then
    echo
    echo "Small messages across the link (shoal-bench out-of-place µs per call, median over repeats):"
    echo
    python3 - "$tmp/lat.tsv" <<'EOF'
import statistics, sys, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, size, us = line.split(); t[(c, int(size))].append(float(us))
configs = sorted({c for c, _ in t}); sizes = sorted({s for _, s in t})
print("| size (B) | " + " | ".join(configs) + " |"); print("|---:|" + "---:|" * len(configs))
for s in sizes:
    print(f"| {s} | " + " | ".join(f"{statistics.median(t[(c, s)]):.1f}" if (c, s) in t else "-" for c in configs) + " |")
EOF
  fi
}
if [[ -n "$out" ]]; then report | tee "$out"; else report; fi
