#!/usr/bin/env bash
# The main job: a 4-rank shoal-bench allreduce sweep over loopback on this machine.
# Usage: scripts/demo.sh [extra shoal-bench args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target shoal shoalrun shoal-bench

echo "== 4 ranks, allreduce, float sum, 8 B .. 64 MiB =="
"$build/bin/shoalrun" -np 4 "$build/bin/shoal-bench" allreduce -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 "$@"
