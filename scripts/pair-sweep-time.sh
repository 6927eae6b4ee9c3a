#!/usr/bin/env bash
# The pair sweep's own time on the emulated cluster (scripts/local-cluster.sh), for
# docs/interconnect.md "At scale": for each node count, a sweep of one 8-byte size with one
# iteration and no check (the fixed cost of a round: a communicator per pair, barriers, the
# gather of every rank's times) and one of 1 MiB at the link's rate (what a size adds), each
# with the default 5 repetitions of the schedule (SB_REPEAT=R for another count).
#   scripts/pair-sweep-time.sh [NODES...]      (default 4 8 16; root; the cluster must be down)
# Prints one line per run: nodes, rounds of one repetition, repetitions, sweep seconds,
# seconds per round (over every repetition's rounds).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=$ROOT/scripts/local-cluster.sh
out=$ROOT/build/pair-sweep-time
mkdir -p "$out" && cd "$out" || exit 2
trap '"$C" down >/dev/null 2>&1' EXIT
source "$ROOT/scripts/mpi-env.sh"
export SB_CLUSTER_EAGER=1  # links measured with exchanges both ways: scripts/mpi-env-cluster.sh
repeat=${SB_REPEAT:-5}
printf '%-6s %-7s %-5s %-26s %10s %12s\n' nodes rounds reps sweep seconds per-round
for n in "${@:-4 8 16}"; do
  for n1 in $n; do
    "$C" up --nodes "$n1" --link-mbit 400 >/dev/null || exit 1
    read -ra MPI <<<"timeout 600 mpirun $("$C" mpirun-args --ranks-per-node 1)"
    for what in "8B:-b 8 -e 8 -n 1 -w 0 -c 0" "1MiB:-b 1M -e 1M -n 8 -w 2"; do
      # shellcheck disable=SC2086
      "${MPI[@]}" -np "$n1" "$ROOT/build/bin/collective_perf" --pattern pairs ${what#*:} --repeat "$repeat" --overwrite --out "$out/n$n1-${what%%:*}.h5" \
        </dev/null >"$out/n$n1-${what%%:*}.log" 2>&1 || { echo "nodes $n1 ${what%%:*}: failed ($out/n$n1-${what%%:*}.log)"; continue; }
      /usr/bin/python3 -c "
import h5py; a = h5py.File('$out/n$n1-${what%%:*}.h5').attrs
r = int(a['rounds']) * int(a['repetitions'])
print(f\"{$n1:<6} {int(a['rounds']):<7} {int(a['repetitions']):<5} {'${what%%:*}, ' + '${what#*:}':<26} {float(a['sweep_seconds']):10.2f} {float(a['sweep_seconds']) / r:12.3f}\")"
    done
    "$C" down >/dev/null
  done
done
