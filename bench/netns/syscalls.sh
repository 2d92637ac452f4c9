#!/usr/bin/env bash
# CPU time and system calls of every rank of one job on the emulated cluster: each rank runs
# under `perf stat` (task-clock, user and system seconds, and the calls that move or wait for
# data), and one table row per rank is printed.
#
#   bench/netns/syscalls.sh [--name NAME] [--port P] [--label TEXT] [--keep DIR] [--no-header] -- command [args...]
#
#   bench/netns/cluster.sh up 2 --rate 1gbit --name wiresc --subnet 10.215.0
#   bench/netns/syscalls.sh --name wiresc -- build-nocuda/bin/shoal-bench -b 64M -e 64M -n 4 -w 1 -c 0
#   bench/netns/syscalls.sh --name wiresc --label "rx 1m" -- env UCX_TCP_RX_SEG_SIZE=1m \
#       build-nocuda/bin/shoal-bench -b 64M -e 64M -n 4 -w 1 -c 0
#   bench/netns/cluster.sh down --name wiresc
#
# The command is what run.sh starts on every host (its {rank}, {size}, {addr} work here too);
# a leading `env VAR=VALUE ...` is applied to every rank. Counts are per rank and cover the
# whole process (start-up included): compare runs of the same length. Columns: task-clock
# (CPU seconds), user and sys seconds, then the number of sendmsg, sendto, write, writev (what
# sends), recvfrom, recvmsg, read, readv (what receives), epoll_wait, poll and sched_yield calls.
# Needs root (namespaces) and perf with the syscalls tracepoints.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name=shoalnet port=29500 label="" keep="" header=1
while (($#)); do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --no-header) header=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
(($#)) || { echo "syscalls.sh: no command" >&2; exit 2; }
envs=()
if [[ "$1" == env ]]; then
  shift
  while (($#)) && [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
fi
calls=(sendmsg sendto write writev recvfrom recvmsg read readv epoll_wait poll sched_yield)
events=task-clock
for c in "${calls[@]}"; do events+=",syscalls:sys_enter_$c"; done
dir=${keep:-$(mktemp -d)}
mkdir -p "$dir"
rm -f "$dir"/stat-*.txt
status=0
env "${envs[@]}" "$here/run.sh" --name "$name" --port "$port" --timeout-s 300 \
  perf stat -e "$events" -o "$dir/stat-{rank}.txt" -- "$@" >"$dir/job.log" 2>&1 || status=$?
if ((status)); then
  echo "syscalls.sh: the job failed (status $status):" >&2
  tail -5 "$dir/job.log" >&2
fi
if ((header)); then
  echo "| run | rank | task-clock s | user s | sys s | sendmsg | sendto | write | writev | recvfrom | recvmsg | read | readv | epoll_wait | poll | sched_yield |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
fi
for f in "$dir"/stat-*.txt; do
  [[ -e "$f" ]] || continue
  rank=${f##*/stat-}; rank=${rank%.txt}
  # perf stat lines: "  23,908      syscalls:sys_enter_sendmsg", "  2,901.23 msec task-clock",
  # "  2.06 seconds sys".
  awk -v rank="$rank" -v label="$label" '
    { v = $1; gsub(",", "", v) }
    $2 == "seconds" && $3 == "user" { user = v }
    $2 == "seconds" && $3 == "sys" { sys = v }
    $2 == "msec" && $3 == "task-clock" { clock = v / 1000 }
    $2 ~ /^syscalls:sys_enter_/ { n[substr($2, 20)] = v }
    END {
      printf "| %s | %s | %.2f | %s | %s |", label, rank, clock, user == "" ? "-" : user, sys == "" ? "-" : sys
      split("sendmsg sendto write writev recvfrom recvmsg read readv epoll_wait poll sched_yield", c, " ")
      for (i = 1; i <= 11; i++) printf " %s |", (c[i] in n) ? n[c[i]] : "-"
      printf "\n"
    }' "$f"
done
[[ -z "$keep" ]] && rm -rf "$dir"
exit "$status"
