#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA device and this repository (no
# network needed), configure a CUDA + NCCL build in build-gpu, build only what
# the check needs, run the cuda and unit ctest labels, every GPU benchmark
# (bench/gpu/bench_*), and a one-GPU NCCL smoke run of shoal-bench; print the
# benchmarks' GB/s next to the device's theoretical memory bandwidth; write
# logs and summary.txt into the results directory.
#
#   bench/gpu/check.sh RESULTS_DIR
#
# Environment: CHECK_BUDGET_S (total seconds, default 300), JOBS (default the
# core count), BUILD_DIR (default build-gpu), BUILD_TYPE (default Release; empty
# keeps the build directory's), SHOAL_GPU_BENCH_ARGS (shoal-bench's CUDA-memory
# arguments; default: the long option on its help line that mentions cuda, then
# "cuda"). Every stage runs under `timeout` within what is left of the budget. A piece that is missing (a target that does not exist yet, a
# shoal-bench without CUDA memory) is reported as MISSING, not a failure; the
# exit status is 1 when a stage FAILED, else 0.
set -u -o pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
RESULTS=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "cannot create $1" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$ROOT" && mkdir -p "${BUILD_DIR:-build-gpu}" && cd "${BUILD_DIR:-build-gpu}" && pwd)
BUILD_TYPE=${BUILD_TYPE-Release}
BUDGET=${CHECK_BUDGET_S:-300}
JOBS=${JOBS:-$(nproc)}
START=$(date +%s)
SUMMARY="$RESULTS/summary.txt"
FAILED=0
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
# allowance CAP: seconds a stage may take, at most CAP and what the budget has left (minus 10 s for the summary).
allowance() {
  local rest=$(($(left) - 10))
  [ "$rest" -lt "$1" ] && echo "$rest" || echo "$1"
}
# stage NAME CAP LOG COMMAND...: runs COMMAND under timeout, logs it, records PASS/FAIL/TIMEOUT.
stage() {
  local name=$1 cap=$2 log=$3
  shift 3
  local limit
  limit=$(allowance "$cap")
  if [ "$limit" -le 5 ]; then
    say "SKIPPED  $name (out of time: the budget of ${BUDGET}s is spent)"
    return 3
  fi
  local began rc
  began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local took=$(($(date +%s) - began))
  if [ $rc -eq 0 ]; then
    say "PASS     $name (${took}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "TIMEOUT  $name after ${limit}s (log: $(basename "$log"))"
    FAILED=1
  elif [ $rc -eq 77 ]; then
    say "SKIPPED  $name: $(head -c 300 "$log" | head -1)"
  else
    say "FAIL     $name (exit $rc, ${took}s; log: $(basename "$log"))"
    tail -5 "$log" | sed 's/^/         | /' | tee -a "$SUMMARY"
    FAILED=1
  fi
  return $rc
}

say "shoal GPU check  $(date -u +%FT%TZ)  commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
{ nvidia-smi 2>&1 || echo "nvidia-smi not available"; } >"$RESULTS/nvidia-smi.txt"
{ nvcc --version 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1; } >"$RESULTS/nvcc.txt"

# ---- configure and build ---------------------------------------------------------------
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
command -v ccache >/dev/null &&
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
stage "configure ($(basename "$BUILD"), CUDA + NCCL)" 90 "$RESULTS/configure.log" \
  cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" "${launcher[@]}" ${BUILD_TYPE:+-DCMAKE_BUILD_TYPE=$BUILD_TYPE} \
  -DSHOAL_WITH_CUDA=ON -DSHOAL_WITH_NCCL=ON -DSHOAL_BUILD_TESTS=ON -DSHOAL_BUILD_BENCH=ON || {
  say "the configure step failed: nothing else can run"
  exit 1
}

# Targets: the test programs of the cuda and unit labels (one per tests/<label>/*.cc or .cu),
# the GPU benchmarks, shoalrun and shoal-bench.
targets_of_label() {
  for f in "$ROOT"/tests/"$1"/*.cc "$ROOT"/tests/"$1"/*.cu; do
    [ -e "$f" ] && basename "${f%.*}"
  done
}
CUDA_TESTS=$(targets_of_label cuda)
UNIT_TESTS=$(targets_of_label unit)
# shellcheck disable=SC2086
if ! stage "build (-j$JOBS: cuda and unit tests, gpu-bench, shoalrun, shoal-bench)" 200 "$RESULTS/build.log" \
  cmake --build "$BUILD" -j "$JOBS" --target $CUDA_TESTS gpu-bench $UNIT_TESTS shoalrun shoal-bench; then
  # Build what can be built, piece by piece (ninja keeps what the first try finished).
  for group in "$CUDA_TESTS" gpu-bench "$UNIT_TESTS shoalrun" shoal-bench; do
    # shellcheck disable=SC2086
    stage "build $(echo $group | wc -w) target(s): $(echo $group | cut -c1-60)" 120 \
      "$RESULTS/build-$(echo $group | cut -d' ' -f1).log" cmake --build "$BUILD" -j "$JOBS" --target $group
  done
fi

# ---- the device ---------------------------------------------------------------------------
THEORETICAL=""
if [ -x "$BUILD/bin/gpu/bandwidth" ]; then
  stage "device query (bench/gpu/bandwidth.cu)" 30 "$RESULTS/device.txt" "$BUILD/bin/gpu/bandwidth"
  THEORETICAL=$(grep -o 'theoretical_GBps [0-9.]*' "$RESULTS/device.txt" | awk '{print $2}')
  [ -n "$THEORETICAL" ] && say "device: $(head -1 "$RESULTS/device.txt")"
else
  say "MISSING  bench/gpu/bandwidth was not built"
fi
if [ -z "$THEORETICAL" ]; then
  say "no theoretical bandwidth from the device query; nvidia-smi says: $(nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader 2>&1 | head -1)"
fi

# ---- tests --------------------------------------------------------------------------------
# -V keeps every test's output, so a cuda test that skipped (no usable device) shows up here.
stage "ctest -L cuda" 120 "$RESULTS/ctest_cuda.log" ctest --test-dir "$BUILD" -L cuda -V -j "$JOBS" --timeout 120
if [ -f "$RESULTS/ctest_cuda.log" ]; then
  skipped=$(grep -cE '\[  SKIPPED \] .* \([0-9]+ ms\)' "$RESULTS/ctest_cuda.log")
  passed=$(grep -cE '\[       OK \] .* \([0-9]+ ms\)' "$RESULTS/ctest_cuda.log")
  say "         cuda tests: $passed passed, $skipped skipped$([ "$skipped" -gt 0 ] && echo " ($(grep -m1 -o 'no CUDA device: .*' "$RESULTS/ctest_cuda.log"))")"
fi
stage "ctest -L unit" 150 "$RESULTS/ctest_unit.log" ctest --test-dir "$BUILD" -L unit -j "$JOBS" --timeout 150 \
  --output-on-failure
[ -f "$RESULTS/ctest_unit.log" ] && say "         $(grep -m1 'tests passed' "$RESULTS/ctest_unit.log")"

# ---- benchmarks ---------------------------------------------------------------------------
shopt -s nullglob
benches=("$BUILD"/bin/gpu/bench_*)
[ ${#benches[@]} -eq 0 ] && say "MISSING  no GPU benchmark was built (bench/gpu/bench_*)"
for bench in "${benches[@]}"; do
  name=$(basename "$bench")
  stage "$name" 60 "$RESULTS/$name.log" "$bench"
  grep '^kernel ' "$RESULTS/$name.log" | awk -v peak="${THEORETICAL:-0}" '{
      line = sprintf("         %-48s %12s B %10s us %8s GB/s", $2, $4, $6, $8)
      if (peak > 0) line = line sprintf("  (%4.1f%% of %.0f GB/s)", 100 * $8 / peak, peak)
      print line }' | tee -a "$SUMMARY"
done

# ---- NCCL smoke run: one rank on the one GPU -----------------------------------------------
# (NCCL refuses two ranks of one communicator on the same device, so one GPU means one rank.)
SHOALRUN="$BUILD/bin/shoalrun"
BENCH="$BUILD/bin/shoal-bench"
if [ ! -x "$BENCH" ] || [ ! -x "$SHOALRUN" ]; then
  say "MISSING  NCCL smoke run: shoal-bench or shoalrun was not built"
elif ! "$BENCH" -h 2>&1 | grep -qi cuda; then
  say "MISSING  NCCL smoke run: this shoal-bench has no CUDA-memory option yet (its -h never mentions cuda)"
else
  # The flag: SHOAL_GPU_BENCH_ARGS, else the first long option on a help line that mentions cuda, with "cuda".
  flag=$("$BENCH" -h 2>&1 | grep -i cuda | grep -oE -- '--[a-z][a-z-]*' | head -1)
  BENCH_ARGS=${SHOAL_GPU_BENCH_ARGS:-${flag:---memory} cuda}
  for compressor in none fp16 topk; do
    copt=()
    [ "$compressor" != none ] && copt=(--compressor "$compressor")
    # shellcheck disable=SC2086
    stage "NCCL smoke: shoal-bench allreduce $BENCH_ARGS ${copt[*]} (1 rank)" 60 "$RESULTS/nccl_smoke_$compressor.log" \
      "$SHOALRUN" -np 1 --timeout-s 50 "$BENCH" allreduce -b 1M -e 256M -f 16 -n 10 -w 3 $BENCH_ARGS "${copt[@]}"
    grep -E '^(\[[0-9]+\] )? *[0-9]+ +[0-9]+ ' "$RESULTS/nccl_smoke_$compressor.log" | tail -3 | sed 's/^/         /' | tee -a "$SUMMARY"
  done
  # The other collectives shoal-bench runs on CUDA memory (the C API's tensor forms), each checked (-c 1).
  for coll in allgather broadcast reduce_scatter alltoall sendrecv reduce gather scatter; do
    # shellcheck disable=SC2086
    stage "NCCL smoke: shoal-bench $coll $BENCH_ARGS (1 rank)" 30 "$RESULTS/nccl_smoke_$coll.log" \
      "$SHOALRUN" -np 1 --timeout-s 25 "$BENCH" "$coll" -b 1M -e 64M -f 8 -n 5 -w 2 $BENCH_ARGS
    grep -E '^(\[[0-9]+\] )? *[0-9]+ +[0-9]+ ' "$RESULTS/nccl_smoke_$coll.log" | tail -1 | sed 's/^/         /' | tee -a "$SUMMARY"
  done
fi

say "done in $(($(date +%s) - START))s of ${BUDGET}s; logs in $RESULTS"
if [ $FAILED -eq 0 ]; then
  say "RESULT   all stages that ran passed"
else
  say "RESULT   some stage FAILED (see above)"
fi
exit $FAILED
