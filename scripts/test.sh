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

stage setup bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
sanitizers=${SHOAL_TEST_SANITIZERS:-1}
stage "main configure" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON \
  -DSHOAL_BUILD_BENCH=ON
stage "main build" cmake --build "$build" -j "$(nproc)"

# The sanitizer and fuzz trees build in the background while the main tree's
# tests run, at the lowest CPU priority (SCHED_IDLE where chrt can set it,
# else nice 19): the compilers only take the cycles the tests leave idle (ranks
# waiting for peers, deadlines, process start-up), and a test's thread that
# wakes takes its core back at once, so the tests' deadlines see the machine
# they saw before. The build's output is printed when it is waited for.
background_build=""
stop_background_build() {
  if [ -n "$background_build" ]; then kill -- "-$background_build" 2>/dev/null || true; fi
}
trap stop_background_build EXIT
if [ "$sanitizers" != 0 ]; then
  idle=(nice -n 19)
  if chrt --idle 0 true 2>/dev/null; then idle=(chrt --idle 0 nice -n 19); fi
  sanitizer_build_log=$build/sanitizer-build.log
  # setsid: its own process group, so that a failing stage can stop all of it.
  setsid "${idle[@]}" bash scripts/test_sanitizers.sh build >"$sanitizer_build_log" 2>&1 &
  background_build=$!
  background_begin=$(date +%s)
  echo "test.sh: sanitizer and fuzz trees building in the background (${idle[*]}; output in $sanitizer_build_log)"
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
# a sanitizer report; then TSan on the runtime label, then every fuzz target
# for SHOAL_FUZZ_SECONDS (docs/reliability.md). SHOAL_TEST_SANITIZERS=0 skips
# all three.
if [ "$sanitizers" != 0 ]; then
  build_status=0
  wait_begin=$(date +%s)
  wait "$background_build" || build_status=$?
  background_build=""
  cat "$sanitizer_build_log"
  if [ "$build_status" -ne 0 ]; then
    echo "test.sh: the sanitizer and fuzz builds FAILED (exit $build_status); output above" >&2
    exit "$build_status"
  fi
  echo "test.sh: sanitizer and fuzz builds took $(($(date +%s) - background_begin)) s in the background," \
    "$(($(date +%s) - wait_begin)) s of it after the main tree's tests"
  stage "sanitizers (ASan+UBSan, TSan)" bash scripts/test_sanitizers.sh
  stage fuzz bash scripts/test_fuzz.sh
fi
echo "test.sh: every stage passed in $(($(date +%s) - begin_all)) s"
