#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
# Exits non-zero on any failure. Usage: scripts/test.sh [extra ctest args]
#
# Configurations: the default one (CUDA and NCCL on when nvcc is found: GPU
# code compiles and links, GPU tests skip without a device) runs every test;
# then the sanitizer and fuzz configurations below (CPU-only, clang).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON -DSHOAL_BUILD_BENCH=ON
cmake --build "$build" -j "$(nproc)"
# Each test has its own deadline; a hang fails the run instead of stalling it.
# The single-process labels run one test per core; the ones that fork ranks,
# build consumers or bring up namespaces run one at a time (their deadlines
# assume the ranks have the cores).
parallel_labels='unit|compressors|collectives|runtime'
ctest --test-dir "$build" --output-on-failure --timeout 600 -j "$(nproc)" -L "$parallel_labels" "$@"
ctest --test-dir "$build" --output-on-failure --timeout 600 -j 1 -LE "$parallel_labels" "$@"
# The Python tests: pytest over tests/python (bindings, shoal.torch, the training examples)
# under Debian's /usr/bin/python3; pytest's "no tests collected" counts as a failure.
bash scripts/test_python.sh "$build"

# The CPU-only configuration (SHOAL_WITH_CUDA=OFF) is the clang ASan+UBSan one:
# it proves the library builds and passes without CUDA and that no test makes
# a sanitizer report; then TSan on the runtime label, then every fuzz target
# for SHOAL_FUZZ_SECONDS (docs/reliability.md). SHOAL_TEST_SANITIZERS=0 skips
# all three.
if [ "${SHOAL_TEST_SANITIZERS:-1}" != 0 ]; then
  bash scripts/test_sanitizers.sh
  bash scripts/test_fuzz.sh
fi
