#!/usr/bin/env bash
# The fuzz step of the test command (docs/reliability.md): every libFuzzer
# target of tests/fuzz (ctest label "fuzz") for SHOAL_FUZZ_SECONDS each
# (default 40), in the ASan+UBSan tree that scripts/test_sanitizers.sh builds
# (configured here if it is missing). A crash, sanitizer report, leak or slow
# input fails it; the reproducer is in <tree>/fuzz-artifacts/<name>/.
# Usage: scripts/test_fuzz.sh [ctest -R regex]
set -euo pipefail
cd "$(dirname "$0")/.."

asan=${SHOAL_ASAN_DIR:-build-asan}
seconds=${SHOAL_FUZZ_SECONDS:-40}
begin=$(date +%s)
cmake -S . -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DSHOAL_WITH_CUDA=OFF -DSHOAL_BUILD_BENCH=OFF -DSHOAL_BUILD_TESTS=ON -DSHOAL_SANITIZE=address,undefined \
  -DSHOAL_FUZZ=ON -DSHOAL_FUZZ_SECONDS="$seconds" >/dev/null
targets=$(cd tests/fuzz && ls fuzz_*.cc | sed 's|\.cc$||')
# shellcheck disable=SC2086
cmake --build "$asan" -j "$(nproc)" --target $targets
filter=()
[ -n "${1:-}" ] && filter=(-R "$1")
# One target per core: each is one single-threaded process bounded by -max_total_time.
ctest --test-dir "$asan" --output-on-failure -j "$(nproc)" -L fuzz "${filter[@]}"
echo "test_fuzz: $(echo "$targets" | wc -w) targets x ${seconds} s took $(($(date +%s) - begin)) s"
