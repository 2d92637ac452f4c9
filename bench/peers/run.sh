#!/usr/bin/env bash
# Runs the same allreduce sweep (float sum) on shoal, Gloo and Open MPI and
# writes a side-by-side busbw table.
#
#   bench/peers/run.sh [-o OUTDIR] [-r REPEATS] [-N "2 4"] [-b 4K] [-e 256M]
#                      [-f 4] [--only shoal,gloo,mpi] [--gloo-algos "..."]
#                      [--quick] [--no-build]
#
# Configurations: shoal (build/bin/shoalrun + shoal-bench, skipped with a
# message if absent), Gloo (one per --gloo-algos entry; FileStore + TCP on
# 127.0.0.1), Open MPI with its default transports (vader shared memory on one
# host) and Open MPI forced onto TCP (--mca pml ob1 --mca btl tcp,self).
#
# Each configuration runs REPEATS times, interleaved (repeat loop outermost)
# so that background noise spreads over all configurations, in an order that
# rotates with the repeat and after a SETTLE_S pause (default 1 s) so that no
# configuration always starts inside the previous one's teardown; tables show
# medians. To bound the run time the sweep is split by size class, large
# messages running fewer iterations (ITERS_SMALL/ITERS_MID/ITERS_LARGE,
# "iters:warmup", sizes <= SMALL_MAX / <= MID_MAX / above).
#
# Outputs in OUTDIR (default <repo>/build/peers): results.md, raw.tsv,
# medians.tsv, manifest.tsv, logs/. The peer programs (gloo_allreduce, mpi_allreduce) are
# built into and run from $PEERS_BIN when it is set, else OUTDIR.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

out="$repo/build/peers"
repeats=3
nlist="2 4"
minb=4K
maxb=256M
factor=4
only="shoal,gloo,mpi"
gloo_algos="ring ring_chunked halving_doubling new_ring new_bcube"
build=1
: "${ITERS_SMALL:=50:5}"    # sizes <= SMALL_MAX: latency-bound, cheap
: "${ITERS_MID:=10:2}"      # sizes <= MID_MAX
: "${ITERS_LARGE:=2:1}"     # bigger: ~1-2 s per 256 MiB iteration at N=4 on 2 cores
: "${SETTLE_S:=1}"          # pause before each configuration (seconds)
: "${SMALL_MAX:=256K}"
: "${MID_MAX:=16M}"
: "${RUN_TIMEOUT:=600}"     # seconds per benchmark invocation
SHOAL_BIN="${SHOAL_BIN:-$repo/build/bin}"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -r) repeats="$2"; shift 2 ;;
    -N) nlist="$2"; shift 2 ;;
    -b) minb="$2"; shift 2 ;;
    -e) maxb="$2"; shift 2 ;;
    -f) factor="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --gloo-algos) gloo_algos="$2"; shift 2 ;;
    --quick) maxb=16M; repeats=1; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

# "4K" -> 4096 (binary units, like the benchmarks' -b/-e).
to_bytes() {
  local v="${1%[bB]}" m=1
  case "$v" in
    *[kK]) m=1024; v="${v%?}" ;;
    *[mM]) m=$((1 << 20)); v="${v%?}" ;;
    *[gG]) m=$((1 << 30)); v="${v%?}" ;;
  esac
  echo $((v * m))
}

minb=$(to_bytes "$minb"); maxb=$(to_bytes "$maxb")
small_max=$(to_bytes "$SMALL_MAX"); mid_max=$(to_bytes "$MID_MAX")
if ! [[ "$factor" =~ ^[0-9]+$ ]] || ((factor < 2)); then
  echo "run.sh: -f must be an integer >= 2" >&2; exit 2
fi

# Split the geometric sweep into contiguous segments by size class:
# lines "MIN MAX ITERS WARMUP".
segments() {
  local s=$minb cls prev_cls="" seg_lo=0 seg_hi=0
  local -a lines=()
  while ((s <= maxb)); do
    if ((s <= small_max)); then cls=$ITERS_SMALL
    elif ((s <= mid_max)); then cls=$ITERS_MID
    else cls=$ITERS_LARGE; fi
    if [[ "$cls" != "$prev_cls" ]]; then
      [[ -n "$prev_cls" ]] && lines+=("$seg_lo $seg_hi ${prev_cls%%:*} ${prev_cls##*:}")
      seg_lo=$s; prev_cls=$cls
    fi
    seg_hi=$s
    s=$((s * factor))
  done
  [[ -n "$prev_cls" ]] && lines+=("$seg_lo $seg_hi ${prev_cls%%:*} ${prev_cls##*:}")
  printf '%s\n' "${lines[@]}"
}

want() { [[ ",$only," == *",$1,"* ]]; }

mkdir -p "$out/logs"
rm -f "$out"/logs/*.log "$out"/logs/*.json "$out"/logs/*.err \
  "$out/results.md" "$out/raw.tsv" "$out/medians.tsv"
# The peer programs: $PEERS_BIN when set (as headline.sh reads it), else OUTDIR.
peers="${PEERS_BIN:-$out}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/shoal-peers.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
manifest="$out/manifest.tsv"
printf '# label\tnranks\trep\tkind\tlog\tjson\tdelayed_acks\n' >"$manifest"

if ((build)); then
  bash "$repo/scripts/setup.sh" --peers
  "$here/build.sh" "$peers" || echo "run.sh: peer build failed; continuing with what exists" >&2
fi

have_gloo=0; have_mpi=0; have_shoal=0
if want gloo; then
  if [[ -x "$peers/gloo_allreduce" ]]; then have_gloo=1
  else echo "run.sh: $peers/gloo_allreduce missing, skipping Gloo" >&2; fi
fi
if want mpi; then
  if [[ -x "$peers/mpi_allreduce" ]] && command -v mpirun >/dev/null; then have_mpi=1
  else echo "run.sh: mpi_allreduce or mpirun missing, skipping Open MPI" >&2; fi
fi
if want shoal; then
  if [[ -x "$SHOAL_BIN/shoalrun" && -x "$SHOAL_BIN/shoal-bench" ]]; then have_shoal=1
  else echo "run.sh: $SHOAL_BIN/shoalrun or shoal-bench not built, skipping shoal (build the main project first)" >&2; fi
fi

mpirun_base=(mpirun --allow-run-as-root --oversubscribe)
failures=0
cur_log=""
start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# Gloo has no launcher: start ranks 1..N-1 in the background, rank 0 in the
# foreground (its stdout is the table), with a fresh FileStore directory.
run_gloo() {  # algo nranks args...  (log: $cur_log, set by run_one)
  local algo=$1 n=$2 log=$cur_log; shift 2
  local store rc=0 prc r p
  store="$(mktemp -d "$tmp/store.XXXXXX")"
  local -a pids=()
  for ((r = 1; r < n; r++)); do
    timeout "$RUN_TIMEOUT" "$peers/gloo_allreduce" --rank "$r" --size "$n" \
      --store-dir "$store" --algo "$algo" "$@" >/dev/null 2>>"$log.err" &
    pids+=($!)
  done
  timeout "$RUN_TIMEOUT" "$peers/gloo_allreduce" --rank 0 --size "$n" \
    --store-dir "$store" --algo "$algo" "$@" >"$log" 2>&1 || rc=$?
  for p in "${pids[@]}"; do
    wait "$p"; prc=$?
    ((rc == 0)) && rc=$prc
  done
  rm -rf "$store"
  return "$rc"
}

# System-wide TcpExt DelayedACKs counter: a jump during a run means TCP
# delayed-ACK stalls (a known hazard for Gloo on loopback). Other jobs'
# traffic counts too, so treat it as a hint.
delayed_acks() {
  awk '/^TcpExt:/ { if (!h) { split($0, k); h = 1 } else { split($0, v);
         for (i in k) if (k[i] == "DelayedACKs") print v[i] } }' /proc/net/netstat 2>/dev/null || echo 0
}

run_one() {  # label nranks rep seg kind cmd...  (records the run in the manifest)
  local label=$1 n=$2 rep=$3 seg=$4 kind=$5; shift 5
  local tag="${label// /_}_n${n}_r${rep}_s${seg}"
  local log="$out/logs/$tag.log" json=""
  cur_log=$log
  [[ "$kind" == shoal ]] && json="$out/logs/$tag.json"
  local t0=$SECONDS rc=0 da0 dack
  da0=$(delayed_acks)
  if [[ "$kind" == shoal ]]; then
    timeout "$RUN_TIMEOUT" "$@" --json "$json" >"$log" 2>&1 || rc=$?
  elif [[ "$1" == run_gloo ]]; then
    "$@" || rc=$?
  else
    timeout "$RUN_TIMEOUT" "$@" >"$log" 2>&1 || rc=$?
  fi
  dack=$(($(delayed_acks) - da0))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$n" "$rep" "$kind" "$log" "$json" "$dack" >>"$manifest"
  printf 'run.sh: [%4ds] %-22s N=%s rep %s seg %s: %ds, delayed ACKs +%s%s\n' $((SECONDS - start)) \
    "$label" "$n" "$rep" "$seg" $((SECONDS - t0)) "$dack" "$( ((rc)) && echo " FAILED rc=$rc (see $log)")"
  ((rc)) && failures=$((failures + 1))
  [[ -s "$log.err" ]] || rm -f "$log.err"
  return 0
}

mapfile -t segs < <(segments)
echo "run.sh: sweep $minb..$maxb x$factor in ${#segs[@]} segment(s): ${segs[*]/%/;}"
echo "run.sh: N = $nlist, repeats = $repeats, output $out"

# One configuration of one segment. Before each, a pause lets the previous
# job's processes finish exiting (mpirun's teardown overlapped the next
# job's first sizes), and the order of configurations rotates with the repeat
# so that no configuration always runs first after another's teardown.
run_config() {  # config n rep seg
  local config=$1 n=$2 rep=$3 k=$4
  sleep "$SETTLE_S"
  case "$config" in
    shoal)
      run_one "shoal" "$n" "$rep" "$k" shoal \
        "$SHOAL_BIN/shoalrun" -np "$n" "$SHOAL_BIN/shoal-bench" allreduce -a 3 "${sweep[@]}" ;;
    gloo:*)
      run_one "gloo ${config#gloo:}" "$n" "$rep" "$k" peer run_gloo "${config#gloo:}" "$n" "${sweep[@]}" ;;
    ompi_default)
      run_one "ompi default" "$n" "$rep" "$k" peer \
        "${mpirun_base[@]}" -np "$n" "$peers/mpi_allreduce" "${sweep[@]}" ;;
    ompi_tcp)
      # pml ob1 is named too: with pml ucx (the upstream default where UCX
      # is present) the btl list would be ignored.
      run_one "ompi tcp" "$n" "$rep" "$k" peer \
        "${mpirun_base[@]}" --mca pml ob1 --mca btl tcp,self -np "$n" \
        "$peers/mpi_allreduce" "${sweep[@]}" ;;
  esac
}
configs=()
((have_shoal)) && configs+=(shoal)
if ((have_gloo)); then for a in $gloo_algos; do configs+=("gloo:$a"); done; fi
((have_mpi)) && configs+=(ompi_default ompi_tcp)

for ((rep = 1; rep <= repeats; rep++)); do
  for n in $nlist; do
    for ((k = 0; k < ${#segs[@]}; k++)); do
      read -r lo hi it wu <<<"${segs[$k]}"
      sweep=(-b "$lo" -e "$hi" -f "$factor" -n "$it" -w "$wu")
      for ((c = 0; c < ${#configs[@]}; c++)); do
        run_config "${configs[$(((c + rep - 1) % ${#configs[@]}))]}" "$n" "$rep" "$k"
      done
    done
  done
done

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
meta="$out/meta.txt"
{
  echo "- load average (1/5/15 min) at start: $load_start, at end: $load_end"
  echo "- finished $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname), $(nproc) CPUs, $(uname -r)"
  echo "- repeats: $repeats (median shown); iterations:warmup by size: <= $SMALL_MAX $ITERS_SMALL, <= $MID_MAX $ITERS_MID, larger $ITERS_LARGE; every size also runs one untimed checked iteration"
  echo "- time per size: max over ranks of the mean per-iteration time (peers; shoal-bench -a 3, $SHOAL_BIN)"
  echo "- Gloo $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null || echo '?') (Debian libgloo-dev), TCP on 127.0.0.1, FileStore; old-API algorithms in place, new_* out of place"
  echo "- $(mpirun --version 2>/dev/null | head -n1 || echo 'no mpirun'); 'ompi default' = Debian defaults (pml ob1, btl vader shared memory), 'ompi tcp' = --mca pml ob1 --mca btl tcp,self; out of place"
  echo "- All ranks share one host with no pinning; with more ranks than cores and other jobs running, numbers are noisy."
} >"$meta"

echo "run.sh: all runs done in $((SECONDS - start)) s, $failures failure(s)"
python3 "$here/aggregate.py" --manifest "$manifest" --outdir "$out" --meta "$meta"
agg=$?
if [[ -s "$out/raw.tsv" && "$out/raw.tsv" -nt "$manifest" ]]; then
  echo "run.sh: wrote $out/results.md, $out/raw.tsv, $out/medians.tsv (logs in $out/logs)"
else
  echo "run.sh: no results to tabulate (logs in $out/logs)" >&2
fi
((failures == 0 && agg == 0))
