#!/usr/bin/env bash
# Builds the peer benchmarks (Gloo, MPI) used to compare shoal's allreduce
# against. Deliberately outside the CMake build: shoal itself must not need
# Gloo or MPI. Debian packages: libgloo-dev openmpi-bin libopenmpi-dev.
#
#   bench/peers/build.sh [OUTDIR]      (default: <repo>/build/peers)
#
# Builds whatever it can and says what it skipped; exits non-zero only if
# nothing could be built or a compile fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/build/peers}"
mkdir -p "$out"

CXX="${CXX:-g++}"
MPICXX="${MPICXX:-mpicxx}"
CXXFLAGS="${CXXFLAGS:--O2 -g -std=c++17 -Wall -Wextra}"

built=0

if [[ -f /usr/include/gloo/allreduce.h ]] || echo '#include <gloo/allreduce.h>' |
     "$CXX" -std=c++17 -fsyntax-only -x c++ - 2>/dev/null; then
  echo "build.sh: $out/gloo_allreduce"
  # shellcheck disable=SC2086  # CXXFLAGS is a flag list
  "$CXX" $CXXFLAGS -o "$out/gloo_allreduce" "$here/gloo_allreduce.cc" -lgloo -pthread
  built=$((built + 1))
else
  echo "build.sh: Gloo headers not found, skipping gloo_allreduce (apt-get install libgloo-dev)" >&2
fi

if command -v "$MPICXX" >/dev/null 2>&1; then
  echo "build.sh: $out/mpi_allreduce"
  # shellcheck disable=SC2086
  "$MPICXX" $CXXFLAGS -o "$out/mpi_allreduce" "$here/mpi_allreduce.cc"
  built=$((built + 1))
else
  echo "build.sh: $MPICXX not found, skipping mpi_allreduce (apt-get install openmpi-bin libopenmpi-dev)" >&2
fi

if ((built == 0)); then
  echo "build.sh: nothing built" >&2
  exit 1
fi
