#!/usr/bin/env bash
# Runs one rank started by bench/netns/run.sh (which sets SHOAL_RANK and SHOAL_WORLD_SIZE) bound
# to its own share of this machine's CPUs, as shoalrun --bind-to cores binds the ranks it starts:
# when the ranks are no more than the CPUs, rank r of N gets CPUs r*each .. r*each+each-1 with
# each = CPUs / N (2 ranks on 2 CPUs: one core each); otherwise it runs unbound.
#
#   bench/netns/run.sh --name NAME bench/train/bind.sh prog [args...]
#
# (The emulated hosts are network namespaces of one machine: their ranks share its CPUs, which
# the scheduler otherwise places and moves freely.)
set -u
cpus=$(nproc)
size=${SHOAL_WORLD_SIZE:-1}
rank=${SHOAL_RANK:-0}
if ((size >= 1 && size <= cpus && rank >= 0 && rank < size)); then
  each=$((cpus / size))
  exec taskset -c "$((rank * each))-$((rank * each + each - 1))" "$@"
fi
exec "$@"
