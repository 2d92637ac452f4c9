#!/usr/bin/env bash
# Measures the fault matrix of docs/reliability-store.md: for each fault (a dead
# rank: SIGKILL; a frozen rank: SIGSTOP) x collective x compressor, 3 ranks on
# loopback run rank_worker's "fault" mode, and the time from the fault to each
# survivor's error is printed as a Markdown table row. Not a test: a measurement
# (the CI machine's load shows in the numbers).
# Usage: fault_matrix.sh <bin dir> [SHOAL_TIMEOUT_S, default 5]
set -euo pipefail
bin=$1
timeout_s=${2:-5}
world=3
victim=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "| fault | collective | compressor | rank 0 | rank 2 | error (rank 0) |"
echo "|---|---|---|---|---|---|"
for fault in kill stop; do
  for collective in allreduce allgather broadcast reduce_scatter; do
    compressors="none"
    [ "$collective" = allreduce ] && compressors="none fp16 topk"
    for compressor in $compressors; do
      port=$(free_port)
      pids=()
      for rank in $(seq 0 $((world - 1))); do
        SHOAL_RANK=$rank SHOAL_WORLD_SIZE=$world SHOAL_STORE=tcp://127.0.0.1:$port SHOAL_TOKEN=matrix$port \
          SHOAL_TIMEOUT_S=$timeout_s SHOAL_COMPRESSOR=$compressor SHOAL_COMPRESS_MIN_BYTES=0 \
          SHOAL_COMPRESSOR_OPTS=$([ "$compressor" = topk ] && echo ef=0 || true) \
          "$bin/rank_worker" fault "$collective" $victim "$fault" > "$work/rank$rank" 2>&1 &
        pids+=($!)
      done
      # Survivors exit on their own (or are killed after 4 x the timeout); then the victim goes.
      deadline=$((SECONDS + 4 * ${timeout_s%.*} + 10))
      for rank in 0 2; do
        while kill -0 "${pids[$rank]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
        kill -9 "${pids[$rank]}" 2>/dev/null || true
      done
      kill -9 "${pids[$victim]}" 2>/dev/null || true
      wait 2>/dev/null || true
      t0=$(sed -n 's/.*fault at \([0-9.]*\).*/\1/p' "$work/rank$victim")
      cells=()
      for rank in 0 2; do
        t=$(sed -n 's/.*detected at \([0-9.]*\):.*/\1/p' "$work/rank$rank" | head -1)
        if [ -n "$t" ] && [ -n "$t0" ]; then cells+=("$(python3 -c "print(f'{$t - $t0:.2f} s')")"); else cells+=("not detected"); fi
      done
      error=$(sed -n 's/.*detected at [0-9.]*: \(SHOAL_[A-Z_]*\).*/\1/p' "$work/rank0" | head -1)
      name=$([ "$fault" = kill ] && echo "dead (SIGKILL)" || echo "frozen (SIGSTOP)")
      echo "| $name | $collective | $compressor | ${cells[0]} | ${cells[1]} | ${error:-none} |"
    done
  done
done
