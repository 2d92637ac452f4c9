#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
# Exits non-zero on any failure. Usage: scripts/test.sh [extra ctest args]
#
# Two configurations: the default one (CUDA and NCCL on when nvcc is found:
# GPU code compiles and links, GPU tests skip without a device) runs every
# test; a CPU-only one (SHOAL_WITH_CUDA=OFF) proves the library builds and
# passes without CUDA (SHOAL_TEST_NOCUDA=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON -DSHOAL_BUILD_BENCH=ON
cmake --build "$build" -j "$(nproc)"
# Each test has its own deadline; a hang fails the run instead of stalling it.
ctest --test-dir "$build" --output-on-failure --timeout 600 -j 1 "$@"
bash scripts/test_python.sh "$build"

if [ "${SHOAL_TEST_NOCUDA:-1}" != 0 ] && grep -q '^SHOAL_CUDA_ENABLED:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "== CPU-only configuration (SHOAL_WITH_CUDA=OFF) =="
  cmake -S . -B "$build-nocuda" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON \
    -DSHOAL_BUILD_BENCH=OFF -DSHOAL_WITH_CUDA=OFF
  cmake --build "$build-nocuda" -j "$(nproc)"
  # The transport-level multi-process tests are the same code in both builds.
  ctest --test-dir "$build-nocuda" --output-on-failure --timeout 600 -j 1 -LE multiproc
fi
