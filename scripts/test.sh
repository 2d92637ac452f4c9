#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test.
# Exits non-zero on any failure. Usage: scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=ON -DSHOAL_BUILD_BENCH=ON
cmake --build "$build" -j "$(nproc)"
# Each test has its own deadline; a hang fails the run instead of stalling it.
ctest --test-dir "$build" --output-on-failure --timeout 600 -j 1 "$@"
