#!/usr/bin/env bash
# Training fidelity and speed of the examples in examples/train/, against PyTorch DDP:
#
#   bench/train/run.sh [--fidelity] [--speed] [--seeds 3] [--tasks LIST] [--rates "1gbit 100mbit"]
#                      [--hosts 2] [--fidelity-ranks HOSTS] [--speed-steps 20] [--only LIST] [--quick] [--no-docs]
#                      [--out DIR] [--build DIR] [--report-only] [--bind] [--repeats N] [--speed-timeout S]
#                      [--fidelity-from DIR] [--epochs-to-target SPEC] [--netns NAME [--subnet S]] [--epochs N]
#
# With neither --fidelity nor --speed it runs both.
#
# Fidelity (one host, loopback, unthrottled; --fidelity-ranks ranks under shoalrun, default --hosts): every
# task with every configuration and --seeds seeds (0, 1, ...), the full training run; rank 0's JSON
# result per run. The report compares each compressor's final metric with dense's on the same seeds,
# and derives the speed runs' time to dense's accuracy only from fidelity runs on as many ranks as
# the speed runs have hosts (the batch per step grows with the ranks, and so do the epochs to it).
# --epochs N trains every fidelity run for N epochs instead of each example's default (more ranks
# take fewer steps per epoch: 4 ranks need about twice the epochs of 2 for the same steps).
#   digits_mlp      shoal none, fp16, bf16, topk, powersgd, sketch, sketch-f32 (exact=0); DDP gloo dense
#                   and + fp16 hook
#   pufferfish_cnn  shoal none (full rank), pufferfish (factorized after 25 %), pufferfish-fused (the
#                   same, its factorized gradients in one fused allreduce, as Pufferfish sends them),
#                   powerfish (PowerSGD during the warm-up, then factorized), powersgd (full rank, rank 4),
#                   powersgd-r16 (full rank, PowerSGD at rank 16: the factors of these small layers cost
#                   little more, and it tracks dense closer on the 360-image test set);
#                   DDP gloo dense and + fp16 hook (full rank: their epochs to dense's accuracy)
#   pufferfish_mnist1d  the same configurations, pufferfish_cnn.py --dataset mnist1d (the CNN in 1-D
#                   on MNIST-1D generated offline: 8000 training, 4000 test samples against digits' 360)
#   embeddings      shoal none, fp16, bf16, topk, powersgd, sketch, sketch-f32 (50,000 training interactions)
#
# Speed (the emulated cluster of bench/netns, one rank per host namespace, --hosts hosts, each
# link limited to every rate of --rates): the same model, data, batch and seed for each of shoal
# with every compressor, DDP gloo dense, DDP + fp16_compress_hook and DDP + powerSGD_hook, each
# for --speed-steps steps (time per step, first 3 steps left out), and the same step on one rank
# without communication (the limit). pufferfish_cnn's step changes mid-run, so its speed runs time
# each step on its own: shoal none and powersgd and the DDP peers full rank (--warmup-frac 1), and
# pufferfish, pufferfish-fused and powerfish factorized from the first step (--warmup-frac 0), with
# a second no-communication run of the factorized step (local-factorized); report.py puts the
# warm-up's full-rank step and the factorized step together for the time to dense's accuracy.
# Each rank counts the bytes its host's interface sends during the timed steps (--count-wire:
# tx_bytes_per_step, rank 0's host, the set-up's parameter broadcast not in it); bench/netns/wire.sh
# counts the whole launch's per host as well (<config>.wire). --bind binds each rank to its own share of the CPUs
# (bench/train/bind.sh, as shoalrun --bind-to cores does on one host; bench/netns/run.sh leaves
# the ranks unbound). A run that fails is recorded with its error. Needs root
# and ip netns (bench/netns/cluster.sh: --netns names it, default shoaltrain, --subnet gives its
# addresses, default cluster.sh's; another cluster on the machine needs other ones); the cluster
# is removed on exit.
#
# --repeats N (speed): the whole speed phase N times at each rate, the configurations of one repeat
# run one after another (A B C ... A B C ...), each repeat with its own no-communication step;
# results in OUT/speed/<rate>/<task>/repeat-<k>/. report.py gives each configuration's median
# step over the repeats and its range, and every ratio (a shoal configuration against each DDP
# peer per step and to dense's accuracy, against the no-communication step) paired within a repeat,
# then its median and range: a goal is judged on the paired median. Single runs on this VM move by
# 20-50 %. --speed-timeout S (default 120) ends a speed launch that hangs (DDP's powerSGD_hook on
# gloo does) after S seconds; it is recorded as failed. --fidelity-from DIR (another run's OUT) or
# --epochs-to-target 'task/config=epochs,...' give the epochs to dense's accuracy that the derived
# time to it needs when this run has no fidelity part (report.py).
#
# Results: OUT/fidelity/<task>/<config>-s<seed>.{json,log}, OUT/speed/<rate>/<task>/<config>.
# {json,log}, OUT/machine.txt (cores, load before and after each phase); then report.py writes
# OUT/tables.md and, unless --no-docs, the tables between the markers in docs/training.md.
# OUT defaults to bench/train/results (not committed). --only takes a comma list of the
# configuration names below (e.g. shoal-none,shoal-sketch); --report-only just rewrites the tables.
# --quick: 1 seed, 2 epochs, 5 speed steps, 1gbit only (a few minutes; for trying it).
#
# Environment: SHOAL_LIBRARY (default BUILD/lib/libshoal.so), PYTHON (default /usr/bin/python3,
# Debian's, with python3-torch), PYTHONPATH gets bindings/python prepended. Every rank runs with
# OMP_NUM_THREADS=1 and SHOAL_SPIN_ROUNDS=0 (a waiting rank yields its core: 2 ranks share 2).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="$repo/build-nocuda"
out="$here/results"
fidelity=0
speed=0
seeds=3
tasks="digits_mlp pufferfish_cnn pufferfish_mnist1d embeddings"
rates="1gbit 100mbit"
hosts=2
fidelity_ranks=""   # default: --hosts, so that the speed runs' time to accuracy can be derived
speed_steps=20
epochs=""   # --epochs: the fidelity runs' epochs (default: each example's own)
quick=0
docs=1
cluster=shoaltrain
subnet=()
only=""
report_only=0
bind=0
repeats=1
speed_timeout=120
report_args=()
: "${RUN_TIMEOUT:=900}"   # seconds per launch (fidelity; the speed runs: --speed-timeout)

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
command_line="bench/train/run.sh $*"
while (($#)); do
  case "$1" in
    --fidelity) fidelity=1; shift ;;
    --speed) speed=1; shift ;;
    --seeds) seeds=$2; shift 2 ;;
    --tasks) tasks=${2//,/ }; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --fidelity-ranks) fidelity_ranks=$2; shift 2 ;;
    --speed-steps) speed_steps=$2; shift 2 ;;
    --only) only=",$2,"; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --bind) bind=1; shift ;;
    --repeats) repeats=$2; shift 2 ;;
    --speed-timeout) speed_timeout=$2; shift 2 ;;
    --fidelity-from) report_args+=(--fidelity-from "$2"); shift 2 ;;
    --epochs-to-target) report_args+=(--epochs-to-target "$2"); shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-docs) docs=0; shift ;;
    --out) out=$2; shift 2 ;;
    --netns) cluster=$2; shift 2 ;;
    --subnet) subnet=(--subnet "$2"); shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
((fidelity || speed || report_only)) || { fidelity=1; speed=1; }
((report_only)) && { fidelity=0; speed=0; }
[[ $repeats =~ ^[1-9][0-9]*$ ]] ||
  { echo "run.sh: --repeats takes a positive whole number, not '$repeats'" >&2; exit 2; }
[[ $hosts =~ ^[1-9][0-9]*$ ]] ||
  { echo "run.sh: --hosts takes a positive whole number, not '$hosts'" >&2; exit 2; }
: "${fidelity_ranks:=$hosts}"
[[ $fidelity_ranks =~ ^[1-9][0-9]*$ ]] ||
  { echo "run.sh: --fidelity-ranks takes a positive whole number, not '$fidelity_ranks'" >&2; exit 2; }
epochs_arg=()
if [[ -n ${epochs:-} ]]; then
  [[ $epochs =~ ^[1-9][0-9]*$ ]] ||
    { echo "run.sh: --epochs takes a positive whole number, not '$epochs'" >&2; exit 2; }
  epochs_arg=(--epochs "$epochs")
fi
if ((quick)); then
  seeds=1 speed_steps=5 rates=1gbit epochs_arg=(--epochs 2)
fi

PYTHON="${PYTHON:-/usr/bin/python3}"
export SHOAL_LIBRARY="${SHOAL_LIBRARY:-$build/lib/libshoal.so}"
export PYTHONPATH="$repo/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 SHOAL_SPIN_ROUNDS=0
shoalrun="$build/bin/shoalrun"
[[ -f "$SHOAL_LIBRARY" && -x "$shoalrun" ]] ||
  { echo "run.sh: need $SHOAL_LIBRARY and $shoalrun (cmake --build $build --target shoal shoalrun)" >&2; exit 1; }
"$PYTHON" -c "import torch" 2>/dev/null || { echo "run.sh: $PYTHON cannot import torch (apt-get install python3-torch)" >&2; exit 1; }
mkdir -p "$out"

machine() {  # one line: when, what, the load
  echo "$(date -u +%FT%TZ) $1: $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
}

# The configurations of each task, "name:arguments".
configs_fidelity() {
  case "$1" in
    digits_mlp) printf '%s\n' "shoal-none:--compression none" "shoal-fp16:--compression fp16" \
      "shoal-bf16:--compression bf16" "shoal-topk:--compression topk --topk-ratio 0.01" \
      "shoal-powersgd:--compression powersgd --powersgd-rank 4" "shoal-sketch:--compression sketch" \
      "shoal-sketch-f32:--compression sketch --sketch-exact 0" \
      "ddp-none:--backend ddp --ddp-hook none" "ddp-fp16:--backend ddp --ddp-hook fp16" ;;
    pufferfish_cnn|pufferfish_mnist1d) printf '%s\n' "shoal-none:--compression none --warmup-frac 1" \
      "pufferfish:--compression none --warmup-frac 0.25" \
      "pufferfish-fused:--compression none --warmup-frac 0.25 --fused" \
      "powerfish:--compression powersgd --after-compression none --warmup-frac 0.25" \
      "shoal-powersgd:--compression powersgd --warmup-frac 1" \
      "shoal-powersgd-r16:--compression powersgd --powersgd-rank 16 --warmup-frac 1" \
      "ddp-none:--backend ddp --ddp-hook none --warmup-frac 1" "ddp-fp16:--backend ddp --ddp-hook fp16 --warmup-frac 1" ;;
    embeddings) printf '%s\n' "shoal-none:--compression none" "shoal-fp16:--compression fp16" \
      "shoal-bf16:--compression bf16" "shoal-topk:--compression topk --topk-ratio 0.01" \
      "shoal-powersgd:--compression powersgd --powersgd-rank 4" "shoal-sketch:--compression sketch" \
      "shoal-sketch-f32:--compression sketch --sketch-exact 0" ;;
  esac
}
configs_speed() {
  case "$1" in
    # The configurations of its fidelity runs, each phase's step on its own: full rank throughout
    # (--warmup-frac 1), or factorized from the first step (--warmup-frac 0); powerfish's
    # factorized phase runs with --after-compression none, as in its fidelity runs.
    pufferfish_cnn|pufferfish_mnist1d) printf '%s\n' "shoal-none:--compression none --warmup-frac 1" \
      "shoal-powersgd:--compression powersgd --powersgd-rank 4 --warmup-frac 1" \
      "shoal-powersgd-r16:--compression powersgd --powersgd-rank 16 --warmup-frac 1" \
      "pufferfish:--compression none --warmup-frac 0" "pufferfish-fused:--compression none --warmup-frac 0 --fused" \
      "powerfish:--compression powersgd --after-compression none --warmup-frac 0" \
      "ddp-none:--backend ddp --ddp-hook none --warmup-frac 1" "ddp-fp16:--backend ddp --ddp-hook fp16 --warmup-frac 1" \
      "ddp-powersgd:--backend ddp --ddp-hook powersgd --warmup-frac 1" ;;
    *) printf '%s\n' "shoal-none:--compression none" "shoal-fp16:--compression fp16" "shoal-bf16:--compression bf16" \
      "shoal-topk:--compression topk --topk-ratio 0.01" "shoal-powersgd:--compression powersgd --powersgd-rank 4" \
      "shoal-sketch:--compression sketch" "shoal-sketch-f32:--compression sketch --sketch-exact 0" \
      "ddp-none:--backend ddp --ddp-hook none" \
      "ddp-fp16:--backend ddp --ddp-hook fp16" "ddp-powersgd:--backend ddp --ddp-hook powersgd" ;;
  esac
}
configs_local() {  # the no-communication runs of a task's speed phase, "name:arguments"
  case "$1" in
    pufferfish_cnn|pufferfish_mnist1d) printf '%s\n' "local:--warmup-frac 1" "local-factorized:--warmup-frac 0" ;;
    *) echo "local:" ;;
  esac
}
script_of() {  # the example a task runs: pufferfish_mnist1d is pufferfish_cnn.py on MNIST-1D
  case "$1" in
    pufferfish_mnist1d) echo pufferfish_cnn ;;
    *) echo "$1" ;;
  esac
}
task_args() {  # arguments every run of a task gets
  case "$1" in
    embeddings) echo "--interactions 50000" ;;
    pufferfish_mnist1d) echo "--dataset mnist1d" ;;
    *) echo "" ;;
  esac
}

# run JSON LAUNCHER... : one training run, its output in JSON's .log; a failure is recorded there.
run() {
  local json=$1; shift
  local log="${json%.json}.log"
  rm -f "$json"
  { echo "# $*"; timeout -k 10 "$RUN_TIMEOUT" "$@" --json "$json"; echo "# exit status $?"; } > "$log" 2>&1
  [[ -s "$json" ]] || echo "run.sh: no result from $(basename "$json" .json): $(grep -v '^#' "$log" | tail -1)" >&2
}

if ((fidelity)); then
  machine "fidelity start"
  for task in $tasks; do
    mkdir -p "$out/fidelity/$task"
    for ((seed = 0; seed < seeds; seed++)); do
      while IFS=: read -r name args; do
        [[ -z $only || $only == *",$name,"* ]] || continue
        echo "fidelity $task $name seed $seed" >&2
        # shellcheck disable=SC2086
        run "$out/fidelity/$task/$name-s$seed.json" "$shoalrun" -np "$fidelity_ranks" --timeout-s "$RUN_TIMEOUT" \
          "$PYTHON" "$repo/examples/train/$(script_of "$task").py" $(task_args "$task") $args --seed "$seed" "${epochs_arg[@]}"
      done < <(configs_fidelity "$task")
    done
  done
  machine "fidelity end"
fi

if ((speed)); then
  if ! ip netns list >/dev/null 2>&1 || [[ $(id -u) != 0 ]]; then
    echo "run.sh: the speed runs need root and ip netns; skipped" >&2
    echo "speed skipped: needs root and ip netns" >> "$out/machine.txt"
  else
    trap '"$repo/bench/netns/cluster.sh" down --name "$cluster" >/dev/null 2>&1' EXIT
    machine "speed start"
    bind_prefix=()
    ((bind)) && bind_prefix=("$here/bind.sh")
    # speed_run JSON TASK ARGS: one configuration on the emulated cluster, its wire bytes beside it.
    speed_run() {
      local json=$1 task=$2 args=$3
      # The launcher's own limit ends the ranks first, so wire.sh still writes its counts.
      # shellcheck disable=SC2086
      RUN_TIMEOUT=$((speed_timeout + 30)) run "$json" "$repo/bench/netns/wire.sh" --name "$cluster" "${json%.json}.wire" -- \
        "$repo/bench/netns/run.sh" --name "$cluster" --timeout-s "$speed_timeout" "${bind_prefix[@]}" "$PYTHON" \
        "$repo/examples/train/$(script_of "$task").py" $(task_args "$task") $args --epochs 1 --max-steps "$speed_steps" --count-wire
    }
    # local_run JSON TASK ARGS: the limit, the same step on one rank without communication.
    local_run() {
      # shellcheck disable=SC2086
      RUN_TIMEOUT=$speed_timeout run "$1" "$PYTHON" "$repo/examples/train/$(script_of "$2").py" $(task_args "$2") $3 \
        --backend local --epochs 1 --max-steps "$speed_steps"
    }
    if ((repeats == 1)); then  # the single-run layout: speed/local/<task>/, speed/<rate>/<task>/
      for task in $tasks; do
        mkdir -p "$out/speed/local/$task"
        while IFS=: read -r name args; do
          local_run "$out/speed/local/$task/$name.json" "$task" "$args"
        done < <(configs_local "$task")
      done
    else
      mkdir -p "$out/speed" && echo "$repeats" > "$out/speed/repeats"
    fi
    for rate in $rates; do
      "$repo/bench/netns/cluster.sh" down --name "$cluster" >/dev/null 2>&1
      "$repo/bench/netns/cluster.sh" up "$hosts" --rate "$rate" --name "$cluster" "${subnet[@]}" > "$out/cluster-$rate.log" 2>&1 ||
        { echo "run.sh: cluster.sh up failed: $(tail -1 "$out/cluster-$rate.log")" >&2; continue; }
      # With --repeats N, repeat k runs every task's no-communication step and every configuration
      # once, in order, before repeat k+1 starts (A B C ... A B C ...): slow and fast spells of the
      # shared machine fall on every configuration alike, and report.py pairs within a repeat.
      for ((k = 1; k <= repeats; k++)); do
        for task in $tasks; do
          dir="$out/speed/$rate/$task"
          ((repeats > 1)) && dir+="/repeat-$k"
          mkdir -p "$dir"
          if ((repeats > 1)); then
            configs_speed "$task" | cut -d: -f1 | while read -r name; do
              [[ -z $only || $only == *",$name,"* ]] && echo "$name"
            done > "$dir/planned"
            configs_local "$task" | cut -d: -f1 >> "$dir/planned"
            while IFS=: read -r name args; do
              echo "speed $rate repeat $k/$repeats $task $name" >&2
              local_run "$dir/$name.json" "$task" "$args"
            done < <(configs_local "$task")
          fi
          while IFS=: read -r name args; do
            [[ -z $only || $only == *",$name,"* ]] || continue
            echo "speed $rate$( ((repeats > 1)) && echo " repeat $k/$repeats") $task $name" >&2
            speed_run "$dir/$name.json" "$task" "$args"
          done < <(configs_speed "$task")
        done
        ((repeats > 1)) && machine "speed $rate repeat $k end"
      done
      "$repo/bench/netns/cluster.sh" down --name "$cluster" >/dev/null 2>&1
      machine "speed $rate end"
    done
  fi
fi

docs_arg=()
((docs)) && docs_arg=(--docs "$repo/docs/training.md")
"$PYTHON" "$here/report.py" "$out" --command "$command_line" --hosts "$hosts" "${docs_arg[@]}" "${report_args[@]}"
