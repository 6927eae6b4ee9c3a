#!/usr/bin/env bash
# A command with noisy neighbours: N busy loops at normal priority beside it (default 2: on
# 2 cores the load average stays near 3 with the command's own work), ended when the
# command ends, whatever its exit. The validation scripts (validate-diagnose, -regress,
# -history) measure their verdicts under it: a shared login node or a busy fabric.
#   scripts/with-noise.sh [-n N] -- COMMAND [ARGS...]      (exit: the command's)
set -u
n=2
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=${2:?-n needs a count}; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: scripts/with-noise.sh [-n N] -- COMMAND [ARGS...]" >&2; exit 2; }
[[ $n =~ ^[0-9]+$ ]] && [ "$n" -le 64 ] || { echo "with-noise: -n '$n' is not allowed: a count 0..64" >&2; exit 2; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < n; i++)); do ( while :; do :; done ) & pids+=($!); done
"$@"
