#!/usr/bin/env bash
# The main job: 4-rank shoal-bench allreduce sweeps on this machine, without and
# with compressors.
# Usage: scripts/demo.sh [extra shoal-bench args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build=${SHOAL_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target shoal shoalrun shoal-bench

run() { "$build/bin/shoalrun" -np 4 "$build/bin/shoal-bench" allreduce "$@"; }

echo "== 4 ranks, allreduce, float sum, 8 B .. 64 MiB, no compression =="
run -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 "$@"

echo "== the same through the fp16 compressor (1 MiB .. 64 MiB) =="
run -b 1M -e 64M -f 4 -n 10 -w 2 -c 1 --compressor fp16 "$@"

echo "== topk (1% of the elements, error feedback) on 1%-dense gradients (1 MiB .. 64 MiB) =="
run -b 1M -e 64M -f 4 -n 10 -w 2 -c 1 --compressor topk --copts ratio=0.01 --density 0.01 "$@"

echo "== powersgd (rank 4) on matrices: a 1-D buffer would go uncompressed (ratio 1) =="
run --shape 4096x1024,1024x1024 -n 5 -w 1 -c 1 --compressor powersgd "$@"
