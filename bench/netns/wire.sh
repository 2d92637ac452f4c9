#!/usr/bin/env bash
# Runs a command and records what crossed the emulated cluster's links meanwhile:
#
#   bench/netns/wire.sh [--name NAME] FILE -- command [args...]
#
# FILE gets JSON: per host, the bytes its eth0 sent and received (the kernel's counters in
# /sys/class/net/eth0/statistics, read inside the host's namespace: measured at the interface,
# Ethernet, IP and TCP headers included), the seconds the command took, and how the whole
# machine's CPU time split meanwhile (/proc/stat: user, system, softirq, idle, other; other
# jobs on the machine count too), and the CPU seconds the command's processes used (user and
# system, from the shell's "times": every rank, as each is waited for by its launcher). The
# exit status is the command's.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=shoalnet
[[ "${1:-}" == --name ]] && { name=$2; shift 2; }
out=${1:?usage: wire.sh [--name NAME] FILE -- command...}
shift
[[ "${1:-}" == -- ]] && shift
(($#)) || { echo "wire.sh: no command" >&2; exit 2; }

hosts_text=$("$here/cluster.sh" hosts --name "$name") || exit 1
mapfile -t hosts <<<"$hosts_text"
counters() {  # one line per host: "tx rx"
  local h ns dev
  for h in "${hosts[@]}"; do
    read -r _ ns _ dev <<<"$h"
    echo "$(ip netns exec "$ns" cat "/sys/class/net/$dev/statistics/tx_bytes") $(ip netns exec "$ns" cat "/sys/class/net/$dev/statistics/rx_bytes")"
  done
}
cpu() { head -n1 /proc/stat; }  # "cpu user nice system idle iowait irq softirq steal ..."

mapfile -t before < <(counters)
cpu0=$(cpu)
t0=$(date +%s.%N)
"$@"
status=$?
t1=$(date +%s.%N)
# "times" prints the shell's own user/system time, then its children's: "0m1.500s 0m0.250s".
# (Run in this shell, not in a pipeline's subshell, which has no children of its own.)
times_file=$(mktemp)
times >"$times_file"
children_cpu=$(tail -n1 "$times_file")
rm -f "$times_file"
seconds_of() { awk -v t="$1" 'BEGIN { split(t, p, "m"); sub("s", "", p[2]); print p[1] * 60 + p[2] }'; }
read -r child_user child_sys <<<"$children_cpu"
cpu1=$(cpu)
mapfile -t after < <(counters)

{
  printf '{"seconds": %.3f, "exit_status": %d,\n "hosts": [' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$status"
  for ((r = 0; r < ${#hosts[@]}; r++)); do
    read -r _ ns _ _ <<<"${hosts[$r]}"
    read -r tx0 rx0 <<<"${before[$r]}"; read -r tx1 rx1 <<<"${after[$r]}"
    printf '%s{"namespace": "%s", "tx_bytes": %d, "rx_bytes": %d}' "$( ((r)) && echo ', ')" "$ns" \
      $((tx1 - tx0)) $((rx1 - rx0))
  done
  printf '],\n "cpu_jiffies": '
  # shellcheck disable=SC2086  # word splitting of the /proc/stat lines is intended
  set -- $cpu0; local_a=("$@"); set -- $cpu1; local_b=("$@")
  d() { echo $((local_b[$1] - local_a[$1])); }
  total=0; for ((i = 1; i < ${#local_a[@]} && i <= 8; i++)); do total=$((total + $(d $i))); done
  user=$(($(d 1) + $(d 2))); sys=$(d 3); idle=$(($(d 4) + $(d 5))); softirq=$(($(d 6) + $(d 7)))
  printf '{"user": %d, "system": %d, "softirq": %d, "idle": %d, "other": %d, "total": %d},\n' \
    "$user" "$sys" "$softirq" "$idle" $((total - user - sys - idle - softirq)) "$total"
  printf ' "command_cpu_seconds": {"user": %s, "system": %s}}\n' "$(seconds_of "$child_user")" "$(seconds_of "$child_sys")"
} >"$out"
exit "$status"
