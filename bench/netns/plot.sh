#!/usr/bin/env bash
# Turns headline.sh's results into PNGs with gnuplot (Debian: gnuplot-nox).
#
#   bench/netns/plot.sh [RESULTS_DIR] [IMG_DIR]    (defaults: bench/netns/results, docs/img)
#
#   IMG_DIR/loopback_busbw.png   busbw vs message size per library, one host (loopback_medians.tsv,
#                                written by bench/peers/run.sh through headline.sh)
#   IMG_DIR/sketch_speedup.png   speedup over dense shoal vs input density, sketch and topk,
#                                per link rate (speedup.tsv, written by report.py)
# A missing input skips its plot with a message.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
res="${1:-$here/results}"
img="${2:-$here/../../docs/img}"
mkdir -p "$img"
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot missing (apt-get install gnuplot-nox)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One data file per series, and a gnuplot "plot" clause for each.
series_plot() {  # DIR: every DIR/*.dat, titled by its name (a file name cannot hold quotes)
  local f clauses=""
  for f in "$1"/*.dat; do
    [[ -e "$f" ]] || continue
    clauses+="${clauses:+, }'$f' using 1:2 with linespoints lw 2 title '$(basename "$f" .dat | tr _ ' ')'"
  done
  echo "$clauses"
}

if [[ -s "$res/loopback_medians.tsv" ]]; then
  mkdir -p "$tmp/lb"
  # Largest rank count in the file; sizes in MiB; one file per library configuration.
  awk -F'\t' -v dir="$tmp/lb" 'NR > 1 && $2 > n { n = $2 } { rows[NR] = $0 }
    END { for (i = 2; i <= NR; i++) { split(rows[i], c, "\t"); if (c[2] != n || c[6] == "") continue
            f = c[1]; gsub(/[^A-Za-z0-9]+/, "_", f); print c[3], c[6] >> (dir "/" f ".dat") }
          print n > (dir "/nranks") }' "$res/loopback_medians.tsv"
  n=$(cat "$tmp/lb/nranks")
  # x tics at the measured sizes, labelled 4K, 64K, 1M, ...
  xtics=$(cat "$tmp"/lb/*.dat | awk '{ print $1 }' | sort -gu | awk '{ v = $1; u = "";
    if (v >= 1048576) { v /= 1048576; u = "M" } else if (v >= 1024) { v /= 1024; u = "K" }
    printf "%s\"%g%s\" %s", (NR > 1 ? ", " : ""), v, u, $1 }')
  for f in "$tmp"/lb/*.dat; do sort -g -o "$f" "$f"; done
  gnuplot <<EOF
set terminal pngcairo size 900,560 font "sans,11"
set output "$img/loopback_busbw.png"
set title "Allreduce on one host (loopback / shared memory), $n ranks on 2 cores"
set xlabel "message size (bytes)"; set ylabel "busbw (GB/s)"
set logscale x 2; set xtics ($xtics); set offsets graph 0.03, graph 0.03, 0, 0; set grid; set key top left
plot $(series_plot "$tmp/lb")
EOF
  echo "plot.sh: $img/loopback_busbw.png"
else
  echo "plot.sh: no $res/loopback_medians.tsv; skipping the loopback plot" >&2
fi

# speedup.tsv may hold its header only (no sparse configuration ran): no plot then.
if [[ $(wc -l < "$res/speedup.tsv" 2>/dev/null || echo 0) -gt 1 ]]; then
  mkdir -p "$tmp/sp"
  awk -F'\t' -v dir="$tmp/sp" 'NR > 1 { print $3, $4 >> (dir "/" $2 "_" $1 ".dat") }' "$res/speedup.tsv"
  for f in "$tmp"/sp/*.dat; do sort -g -o "$f" "$f"; done
  gnuplot <<EOF
set terminal pngcairo size 900,560 font "sans,11"
set output "$img/sketch_speedup.png"
set title "Emulated cluster: compressed allreduce vs dense shoal on sparse inputs"
set xlabel "input density per rank (%)"; set ylabel "speedup over dense shoal (time)"
set logscale xy; set format x "%g"; set offsets graph 0.05, graph 0.05, 0, 0; set grid; set key top right
plot $(series_plot "$tmp/sp"), 1 with lines dt 2 lc rgb "gray" title "dense"
EOF
  echo "plot.sh: $img/sketch_speedup.png"
else
  echo "plot.sh: no $res/speedup.tsv; skipping the speedup plot" >&2
fi
