#!/usr/bin/env bash
# Where a training step's time goes (docs/training.md, "Where the step's time goes"): each
# configuration under bench/train/step_profile.py, which times the parts of the step and reads
# every thread's CPU, plus the same step without communication on one rank and on two ranks at
# once (two independent processes: the compute step under the same contention for 2 cores).
#
#   bench/train/step_breakdown.sh [--build DIR] [--out DIR] [--steps N] [--where "loopback netns"]
#                                 [--only LIST] [--timeline] [--bind]
#
# loopback: 2 ranks under shoalrun on this host; netns: 2 emulated hosts at 1 Gbit/s
# (bench/netns/cluster.sh; needs root). --only: a comma list of configuration names
# (digits-none, digits-powersgd, embeddings-sketch, ...). --timeline: rank 0 also writes a
# SHOAL_TIMELINE trace per run, summarized by bench/train/timeline_summary.py. --bind: the netns
# ranks are bound to their own share of the CPUs (bench/train/bind.sh; shoalrun binds the loopback
# ranks by default).
# Each run's "profile:" lines (one per rank) go to OUT/<where>-<config>.log and to stdout.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="$repo/build-nocuda"
out=/tmp/step_breakdown
steps=30
where="loopback netns"
only=""
timeline=0
bind=0
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --where) where=$2; shift 2 ;;
    --only) only=",$2,"; shift 2 ;;
    --timeline) timeline=1; shift ;;
    --bind) bind=1; shift ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-/usr/bin/python3}"
export SHOAL_LIBRARY="${SHOAL_LIBRARY:-$build/lib/libshoal.so}"
export PYTHONPATH="$repo/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 SHOAL_SPIN_ROUNDS=0   # as bench/train/run.sh runs every rank
mkdir -p "$out"
profile="$here/step_profile.py"

configs() {
  printf '%s\n' "digits-none:digits_mlp:--compression none" "digits-powersgd:digits_mlp:--compression powersgd --powersgd-rank 4" \
    "digits-bf16:digits_mlp:--compression bf16" "embeddings-none:embeddings:--interactions 50000 --compression none" \
    "embeddings-sketch:embeddings:--interactions 50000 --compression sketch" \
    "embeddings-topk:embeddings:--interactions 50000 --compression topk --topk-ratio 0.01"
}
wanted() { [[ -z $only || $only == *",$1,"* ]]; }
load() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"; }

# The limit: the step on one rank, then on two independent ranks at once.
for task in digits_mlp embeddings; do
  extra=""; [[ $task == embeddings ]] && extra="--interactions 50000"
  wanted "local-$task" || continue
  log="$out/local-$task.log"
  { load; "$PYTHON" "$profile" "$repo/examples/train/$task.py" $extra --backend local --epochs 1 --max-steps "$steps"; } \
    > "$log" 2>&1
  { load; "$PYTHON" "$profile" "$repo/examples/train/$task.py" $extra --backend local --epochs 1 --max-steps "$steps" \
      > "$out/local2a-$task.log" 2>&1 &
    "$PYTHON" "$profile" "$repo/examples/train/$task.py" $extra --backend local --epochs 1 --max-steps "$steps" \
      > "$out/local2b-$task.log" 2>&1; wait; } >> "$log" 2>&1
  echo "== local $task (1 rank; then 2 independent ranks at once)"
  grep -h "profile:" "$log" "$out/local2a-$task.log" "$out/local2b-$task.log"
done

for place in $where; do
  launcher=()
  if [[ $place == loopback ]]; then
    launcher=("$build/bin/shoalrun" -np 2 --timeout-s 300)
  else
    "$repo/bench/netns/cluster.sh" down --name shoalstep >/dev/null 2>&1
    "$repo/bench/netns/cluster.sh" up 2 --rate 1gbit --name shoalstep > "$out/cluster.log" 2>&1 ||
      { echo "cluster.sh up failed: $(tail -1 "$out/cluster.log")" >&2; continue; }
    trap '"$repo/bench/netns/cluster.sh" down --name shoalstep >/dev/null 2>&1' EXIT
    launcher=("$repo/bench/netns/run.sh" --name shoalstep --timeout-s 300)
    ((bind)) && launcher+=("$here/bind.sh")
  fi
  while IFS=: read -r name task args; do
    wanted "$name" || continue
    log="$out/$place-$name.log"
    env=()
    ((timeline)) && env=(SHOAL_TIMELINE="$out/$place-$name.trace.json")
    # shellcheck disable=SC2086
    { load; env "${env[@]}" "${launcher[@]}" "$PYTHON" "$profile" "$repo/examples/train/$task.py" $args --epochs 1 \
        --max-steps "$steps"; } > "$log" 2>&1
    echo "== $place $name"
    grep -h "profile:\|^load" "$log"
    if ((timeline)) && [[ -s "$out/$place-$name.trace.json" ]]; then
      "$PYTHON" "$here/timeline_summary.py" "$out/$place-$name.trace.json" | head -30
    fi
  done < <(configs)
  [[ $place == netns ]] && "$repo/bench/netns/cluster.sh" down --name shoalstep >/dev/null 2>&1
done
