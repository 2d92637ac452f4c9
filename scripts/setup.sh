#!/usr/bin/env bash
# Installs the system packages shoal needs to build, test and benchmark.
# Idempotent: does nothing when everything is present.
# Usage: scripts/setup.sh [--peers]   (--peers: also Gloo, Open MPI, iproute2 and gnuplot for
#                                      bench/peers and the emulated cluster of bench/netns)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libucx-dev ucx-utils libfmt-dev libopenblas-dev liblapacke-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3
  python3-numpy python3-pytest python3-torch python3-sklearn python3-venv
)
# The sanitizer and fuzz configurations (scripts/test_sanitizers.sh, test_fuzz.sh): clang with libFuzzer.
packages+=(clang libclang-rt-dev)

# The peers benchmark (bench/peers/) also needs Gloo and Open MPI; bench/netns needs
# iproute2 (ip, tc) and gnuplot for its plots.
if [ "${1:-}" = "--peers" ]; then
  packages+=(libgloo-dev openmpi-bin libopenmpi-dev iproute2 gnuplot-nox)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
