#!/usr/bin/env bash
# Open MPI's "rsh agent" for the emulated cluster: mpirun calls it as
#   mpi_agent.sh [ssh-style options] HOST COMMAND...
# and it runs COMMAND in the namespace whose eth0 has address HOST (from cluster.sh hosts),
# instead of over ssh. Used by headline.sh:
#   ip netns exec NAME-h1 mpirun --mca plm_rsh_agent bench/netns/mpi_agent.sh -H 10.211.0.1,... prog
# The cluster's name comes from SHOAL_NETNS_NAME (default shoalnet).
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done  # ssh options Open MPI may add (-x, -n, ...)
host=${1:?mpi_agent.sh: no host}
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ns=$("$here/cluster.sh" hosts --name "${SHOAL_NETNS_NAME:-shoalnet}" | awk -v h="$host" '$3 == h { print $2 }')
[[ -n "$ns" ]] || { echo "mpi_agent.sh: no host with address $host in the cluster" >&2; exit 1; }
# Like ssh, the command arrives as words for a shell on the remote side.
exec ip netns exec "$ns" /bin/sh -c "$*"
