#!/usr/bin/env bash
# Makes the seed corpora tests/fuzz/corpus/<name>/ from real encodes: each
# target runs once on a few header-only inputs with SHOAL_FUZZ_WRITE_SEED set,
# which makes it record the header and the honest payload bytes of the round
# it fuzzes (tests/fuzz/fuzz_common.h). Usage: tests/fuzz/make_corpus.sh <build tree with SHOAL_FUZZ=ON>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1/bin
export UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=0
seed() {  # seed <name> <hex header>...
  local name=$1 header out
  shift
  mkdir -p "$here/corpus/$name"
  for header in "$@"; do
    out="$here/corpus/$name/seed-$header"
    printf "$(echo "$header" | sed 's/../\\x&/g')" >/tmp/shoal-fuzz-header.$$
    SHOAL_FUZZ_WRITE_SEED="$out" "$bin/fuzz_$name" /tmp/shoal-fuzz-header.$$ >/dev/null 2>&1
  done
  rm -f /tmp/shoal-fuzz-header.$$
}
# sketch: options (0 auto, 1 sketch, 2 compact, 3 dense, 4 ratio, 5 bloom, 6 f32 cells), count/3, world, seed
seed sketch_index 00100001 01200102 02300203 04200104 05ff0045 06200006
seed sketch_values 00100001 01200102 02300203 03100011 04200104 05ff0045 06200016 01400147
# topk: k, count, world (| 0x80: f64), seed
seed topk 03400001 07ff0102 0020800f
# powersgd: rank, rows, cols, round
seed powersgd 01100c00 03201401 00050300
# cast: format|dtype, count/2, world, seed
seed cast 00400001 01400102 02200003 03ff0104
