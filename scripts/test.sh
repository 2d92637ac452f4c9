#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
# Exits non-zero on any failure. Usage: scripts/test.sh [extra ctest args]
#
# Configurations: the default one (CUDA and NCCL on when nvcc is found: GPU
# code compiles and links, GPU tests skip without a device) runs every test;
# then the sanitizer and fuzz configurations below (CPU-only, clang).
# Prints one line per stage with its wall time ("test.sh: <stage> took N s").
set -euo pipefail
cd "$(dirname "$0")/.."

begin_all=$(date +%s)
stage() {
  local name=$1 begin status=0
  shift
  begin=$(date +%s)
  "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "test.sh: $name FAILED (exit $status) after $(($(date +%s) - begin)) s" >&2
    exit "$status"
  fi
  echo "test.sh: $name took $(($(date +%s) - begin)) s"
}

# A sanitizer tree builds in the background while tests of another tree run,
# at the lowest CPU priority (SCHED_IDLE where chrt can set it, else nice 19):
# the compilers take only the cycles the tests leave idle (ranks waiting for
# peers or for a deadline, process start-up), and a test thread that wakes gets
# its core back at once, so the tests' deadlines see the machine they saw
# before. One build at a time; its output is printed when it is waited for.
idle=(nice -n 19)
if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0 nice -n 19); fi
background=""
background_name=""
background_log=""
background_begin=0
start_background() {
  background_name=$1
  background_log=$2
  shift 2
  background_begin=$(date +%s)
  # setsid: a process group of its own, so that a failing stage can stop all of it.
  setsid "${idle[@]}" "$@" >"$background_log" 2>&1 &
  background=$!
  echo "test.sh: $background_name started in the background (${idle[*]}; output in $background_log)"
}
wait_background() {
  local status=0 waited
  waited=$(date +%s)
  wait "$background" || status=$?
  background=""
  cat "$background_log"
  if [ "$status" -ne 0 ]; then
    echo "test.sh: $background_name FAILED (exit $status); its output is above" >&2
    exit "$status"
  fi
  echo "test.sh: $background_name took $(($(date +%s) - background_begin)) s in the background," \
    "$(($(date +%s) - waited)) s of it waited for"
}
stop_background() {
  if [ -n "$background" ]; then kill -- "-$background" 2>/dev/null || true; fi
}
trap stop_background EXIT

stage setup bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
sanitizers=${SHOAL_TEST_SANITIZERS:-1}
stage "main configure" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON \
  -DSHOAL_BUILD_BENCH=ON
stage "main build" cmake --build "$build" -j "$(nproc)"
if [ "$sanitizers" != 0 ]; then
  start_background "ASan+UBSan build (tests and fuzz targets)" "$build/asan-build.log" \
    bash scripts/test_sanitizers.sh asan --build-only
fi

# Each test has its own deadline; a hang fails the run instead of stalling it.
# The single-process labels run one test per core; the ones that fork ranks,
# build consumers or bring up namespaces run one at a time (their deadlines
# assume the ranks have the cores).
parallel_labels='unit|compressors|collectives|runtime'
stage "ctest, single-process labels (-j $(nproc))" \
  ctest --test-dir "$build" --output-on-failure --timeout 600 -j "$(nproc)" -L "$parallel_labels" "$@"
stage "ctest, the other labels (-j 1)" \
  ctest --test-dir "$build" --output-on-failure --timeout 600 -j 1 -LE "$parallel_labels" "$@"
# The Python tests: pytest over tests/python (bindings, shoal.torch, the training examples)
# under Debian's /usr/bin/python3; pytest's "no tests collected" counts as a failure.
stage python bash scripts/test_python.sh "$build"

# The CPU-only configuration (SHOAL_WITH_CUDA=OFF) is the clang ASan+UBSan one:
# it proves the library builds and passes without CUDA and that no test makes
# a sanitizer report; then every fuzz target for SHOAL_FUZZ_SECONDS, then TSan
# on the runtime label (docs/reliability.md). SHOAL_TEST_SANITIZERS=0 skips
# all three.
if [ "$sanitizers" != 0 ]; then
  wait_background
  start_background "TSan build" "$build/tsan-build.log" bash scripts/test_sanitizers.sh tsan --build-only
  stage "ASan+UBSan tests" bash scripts/test_sanitizers.sh asan
  stage fuzz bash scripts/test_fuzz.sh
  wait_background
  stage "TSan tests" bash scripts/test_sanitizers.sh tsan
fi
echo "test.sh: every stage passed in $(($(date +%s) - begin_all)) s"
