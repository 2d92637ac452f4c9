#!/usr/bin/env bash
# Two builds of shoal on one training configuration, interleaved (A B A B ...), each run under
# bench/train/step_profile.py on 2 emulated hosts (bench/netns, one rank each): it prints each
# run's per-rank CPU per step of the engine thread, the Python thread and the others. On a shared
# machine those CPU counts compare two builds; the wall-clock steps do not.
#
#   bench/train/ab_step.sh --a DIR --b DIR [--repeats 3] [--rate 1gbit] [--out DIR] [--perf] \
#       [--name shoalab] [--subnet 10.211.0] [--timeline | --tensor NAME] -- examples/train/digits_mlp.py --compression sketch --epochs 1
#
# DIR is a source tree with its build: DIR/build-nocuda/lib/libshoal.so (or --a-lib/--b-lib FILE),
# its Python package DIR/bindings/python. The example and step_profile.py are this tree's, so
# both sides run the same Python. --perf: rank 0 of each side's first run under `perf record`
# (OUT/a.perf.data, OUT/b.perf.data; `perf report -i FILE --comm shoal-engine --sort sym`).
# --timeline: every run with SHOAL_TIMELINE=OUT/<a|b>-<k>.trace.json (rank 0's), and its tail
# phases printed (bench/train/tail_phases.py --tensor TENSOR: user.weight, or --tensor NAME, which implies it).
# Logs: OUT/<a|b>-<k>.log. Needs root and ip netns; the cluster (bench/netns/cluster.sh --name,
# --subnet: give others' clusters on the machine a wide berth) is removed on exit.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
a="" b="" a_lib="" b_lib="" repeats=3 rate=1gbit out=/tmp/ab_step perf=0 cluster=shoalab subnet=() timeline=""
while (($#)); do
  case "$1" in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --a-lib) a_lib=$2; shift 2 ;;
    --b-lib) b_lib=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --perf) perf=1; shift ;;
    --timeline) timeline=user.weight; shift ;;
    --tensor) timeline=$2; shift 2 ;;
    --name) cluster=$2; shift 2 ;;
    --subnet) subnet=(--subnet "$2"); shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[[ -n $a && -n $b && $# -gt 0 ]] || { echo "ab_step.sh: need --a DIR --b DIR -- example.py [args]" >&2; exit 2; }
a_lib=${a_lib:-$a/build-nocuda/lib/libshoal.so}
b_lib=${b_lib:-$b/build-nocuda/lib/libshoal.so}
for lib in "$a_lib" "$b_lib"; do [[ -f $lib ]] || { echo "ab_step.sh: $lib not found" >&2; exit 1; }; done
script=$1; shift
[[ $script == /* ]] || script="$repo/$script"
mkdir -p "$out"
export OMP_NUM_THREADS=1 SHOAL_SPIN_ROUNDS=0   # as bench/train/run.sh runs every rank
"$repo/bench/netns/cluster.sh" down --name "$cluster" >/dev/null 2>&1
"$repo/bench/netns/cluster.sh" up 2 --rate "$rate" --name "$cluster" "${subnet[@]}" > "$out/cluster.log" 2>&1 ||
  { echo "ab_step.sh: cluster.sh up failed: $(tail -1 "$out/cluster.log")" >&2; exit 1; }
trap '"$repo/bench/netns/cluster.sh" down --name "$cluster" >/dev/null 2>&1' EXIT

# Rank 0 under perf record when asked (the file name comes first), the other ranks as they are.
perf_rank0='f=$1; shift; if [ "${SHOAL_RANK:-0}" = 0 ]; then exec perf record -q -F 1999 -o "$f" -- "$@"; fi; exec "$@"'
for ((k = 1; k <= repeats; k++)); do
  for side in a b; do
    if [[ $side == a ]]; then dir=$a lib=$a_lib; else dir=$b lib=$b_lib; fi
    prefix=()
    ((perf && k == 1)) && prefix=(bash -c "$perf_rank0" perf "$out/$side.perf.data")
    log="$out/$side-$k.log" trace="$out/$side-$k.trace.json"
    traced=()
    [[ -n $timeline ]] && { rm -f "$trace"; traced=(env SHOAL_TIMELINE="$trace"); }
    { echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
      SHOAL_LIBRARY="$lib" PYTHONPATH="$dir/bindings/python" "$repo/bench/netns/run.sh" --name "$cluster" \
        --timeout-s 300 "${traced[@]}" "${prefix[@]}" /usr/bin/python3 "$here/step_profile.py" "$script" "$@"; } > "$log" 2>&1
    echo "== $side run $k ($lib; $(head -1 "$log"))"
    grep -h "profile:" "$log" || tail -3 "$log"
    [[ -n $timeline ]] && /usr/bin/python3 "$here/tail_phases.py" "$trace" --tensor "$timeline"
  done
done
