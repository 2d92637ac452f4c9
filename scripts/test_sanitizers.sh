#!/usr/bin/env bash
# The sanitizer configurations of the test command (docs/reliability.md):
#   1. ASan+UBSan, clang, CPU-only (build-asan): the unit, collectives,
#      compressors and runtime labels, built and run (multiproc runs in the main build). The
#      same tree holds the libFuzzer targets (SHOAL_FUZZ=ON) that
#      scripts/test_fuzz.sh runs.
#   2. TSan, clang, CPU-only (build-tsan): only what the runtime label needs.
# Every report fails the run: -fno-sanitize-recover=all (cmake/fuzz.cmake) and
# halt_on_error below. Prints each step's wall time.
# Usage: scripts/test_sanitizers.sh [asan|tsan] [--build-only]   (default: both)
#   --build-only configures and builds the tree (the ASan one with the fuzz
#   targets) and runs nothing: scripts/test.sh builds each tree that way in the
#   background while other tests run, and the run that follows finds it built.
# The 100-step ResNet-50 soak (runtime.AsyncResNet50: 5 s in the main build,
# about 170 s under ASan and 230 s under TSan) is left out of both: it runs the
# negotiation, fusion and compressor code that the smaller runtime tests run
# under the sanitizers, and it runs in the main build. SHOAL_TSAN_EXCLUDE=<ctest
# regex> replaces the TSan run's exclusion (say why where you use it).
set -euo pipefail
cd "$(dirname "$0")/.."

which=all
build_only=false
for argument in "$@"; do
  case "$argument" in
    asan | tsan) which=$argument ;;
    --build-only) build_only=true ;;
    *) echo "usage: scripts/test_sanitizers.sh [asan|tsan] [--build-only]" >&2; exit 2 ;;
  esac
done
jobs=$(nproc)
asan=${SHOAL_ASAN_DIR:-build-asan}
tsan=${SHOAL_TSAN_DIR:-build-tsan}
clang=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  -DSHOAL_WITH_CUDA=OFF -DSHOAL_BUILD_BENCH=OFF -DSHOAL_BUILD_TESTS=ON)
# UCX patches malloc/mmap to watch registered memory; under a sanitizer's allocator it must not.
export UCX_MEM_EVENTS=no
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

# Tests that fork ranks (failure tests) may pass although a child made a report
# (a dying rank is what they test), so reports also go to files, and any file
# found after a run fails it.
reports_of() {
  local dir=$1/sanitizer-reports
  rm -rf "$dir" && mkdir -p "$dir" && echo "$dir"
}
check_reports() {
  local dir=$1
  if compgen -G "$dir/report.*" >/dev/null; then
    echo "test_sanitizers: sanitizer reports in $dir:" >&2
    cat "$dir"/report.* >&2
    exit 1
  fi
}

soak='^runtime\.AsyncResNet50\.'
programs_of() {  # the programs of the labels given: one per tests/<label>/*.cc
  local label source
  for label in "$@"; do
    for source in "tests/$label"/*.cc; do basename "$source" .cc; done
  done
}

step() {
  local name=$1 begin
  shift
  begin=$(date +%s)
  "$@"
  echo "test_sanitizers: $name took $(($(date +%s) - begin)) s"
}

if [ "$which" != tsan ]; then
  echo "== ASan+UBSan configuration ($asan) =="
  step "asan configure" cmake -S . -B "$asan" "${clang[@]}" -DSHOAL_SANITIZE=address,undefined -DSHOAL_FUZZ=ON
  # Only what the ASan run uses: the test programs of its labels, shoalrun (the README table
  # test) and what they depend on; the multiproc and aggregate programs run in the main build.
  # --build-only makes the fuzz targets too, in the same ninja run (scripts/test_fuzz.sh runs them).
  asan_targets="shoalrun $(programs_of unit collectives compressors runtime)"
  if $build_only; then asan_targets+=" $(programs_of fuzz)"; fi
  # shellcheck disable=SC2086
  step "asan build" cmake --build "$asan" -j "$jobs" --target $asan_targets
  if ! $build_only; then
    # install.* build consumers with the system compiler against the installed
    # library: meaningful in the main build (where they run), not here.
    step "asan tests" ctest --test-dir "$asan" --output-on-failure --timeout 900 -j "$jobs" \
      -L 'unit|collectives|compressors|runtime' -E "^install\.|$soak"
  fi
fi

if [ "$which" != asan ]; then
  echo "== TSan configuration ($tsan) =="
  step "tsan configure" cmake -S . -B "$tsan" "${clang[@]}" -DSHOAL_SANITIZE=thread
  # shellcheck disable=SC2046
  step "tsan build" cmake --build "$tsan" -j "$jobs" --target $(programs_of runtime)
  if ! $build_only; then
    exclude=(-E "${SHOAL_TSAN_EXCLUDE:-$soak}")
    reports=$(reports_of "$tsan")
    TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$reports/report" \
      step "tsan tests" ctest --test-dir "$tsan" --output-on-failure --timeout 900 -j 1 -L runtime "${exclude[@]}"
    check_reports "$reports"
  fi
fi
