#!/usr/bin/env bash
# The history's change points on measured runs (docs/interconnect.md, "History and change
# points"): on the emulated cluster (scripts/local-cluster.sh, links at RATE Mbit/s), per
# case, RUNS interconnect checks (collective_perf all-reduce and all-gather, 256 KiB and
# 1 MiB, one rank a node) one after the other, then analysis/history.py show on them.
# A case is KIND@NODES: healthy (nothing shaped), node (node2's link shaped to SLOW Mbit/s
# from run K on), two (node2's and node3's). A shaped case is a hit when every change point
# is at K (+-1), a miss when none is found, a false alarm when one is elsewhere; a healthy
# case is a false alarm when any is found.
#   scripts/validate-history.sh [OUT]     (root; the cluster must be down; about 90 s a case;
#                                          under flock /run/sb-cluster.lock)
#   CASES="node@4 healthy@4" RUNS=16 K=7 RATE=400 SLOW=200 NOISE=0 (environment; NOISE=2 runs
#   every check under scripts/with-noise.sh -n 2)
# Prints one line per case and the rates; exit 0 when every case is right, 1 otherwise; the
# `history.py show` answers are in OUT/CASE.txt.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=$ROOT/scripts/local-cluster.sh
OUT=$(mkdir -p "${1:-$ROOT/build/validate-history}" && cd "${1:-$ROOT/build/validate-history}" && pwd) || exit 2
CASES=${CASES:-node@4 healthy@4} RUNS=${RUNS:-16} K=${K:-7} RATE=${RATE:-400} SLOW=${SLOW:-200} NOISE=${NOISE:-0}
trap '"$C" down >/dev/null 2>&1' EXIT
source "$ROOT/scripts/mpi-env.sh"
export SB_CLUSTER_EAGER=1  # links measured with exchanges both ways: scripts/mpi-env-cluster.sh
up=0
for case in $CASES; do
  kind=${case%@*} nodes=${case#*@}
  case $kind in healthy) slow=() ;; node) slow=(node2) ;; two) slow=(node2 node3) ;;
    *) echo "validate-history: case '$case': KIND must be healthy, node or two" >&2; exit 2 ;; esac
  if [ "$up" != "$nodes" ]; then
    "$C" down >/dev/null 2>&1
    "$C" up --nodes "$nodes" --link-mbit "$RATE" >/dev/null || exit 1
    up=$nodes
  fi
  read -ra MPI <<<"timeout 300 mpirun $("$C" mpirun-args --ranks-per-node 1)"
  [ "$NOISE" != 0 ] && MPI=("$ROOT/scripts/with-noise.sh" -n "$NOISE" -- "${MPI[@]}")
  name=$kind-$nodes
  rm -rf "${OUT:?}/$name" "$OUT/$name.db" && mkdir -p "$OUT/$name"
  for i in $(seq 1 "$RUNS"); do
    if [ "$i" = "$K" ] && [ ${#slow[@]} -gt 0 ]; then
      "$C" shape "${slow[@]/%/=$SLOW}" >/dev/null || exit 1
    fi
    "${MPI[@]}" -np "$nodes" "$ROOT/build/bin/collective_perf" --ops all-reduce,all-gather -b 256K -e 1M -f 4 -n 8 -w 2 \
      --out "$OUT/$name/run$(printf %02d "$i").h5" </dev/null >"$OUT/$name/run$i.log" 2>&1 \
      || { echo "validate-history: $name run $i failed: $OUT/$name/run$i.log"; exit 1; }
    printf '\r%s: run %d/%d' "$name" "$i" "$RUNS"
  done
  echo
  [ ${#slow[@]} -gt 0 ] && { "$C" shape "${slow[@]/%/=$RATE}" >/dev/null || exit 1; }
  /usr/bin/python3 "$ROOT/analysis/history.py" add "$OUT/$name.db" "$OUT/$name" >/dev/null || exit 1
  /usr/bin/python3 "$ROOT/analysis/history.py" show "$OUT/$name.db" --plot "$OUT/$name.png" >"$OUT/$name.txt" 2>&1
  echo "$name: history.py show exit $?" >>"$OUT/$name.txt"
done
/usr/bin/python3 - "$OUT" "$K" $CASES <<'PY'
import re, sys
out, k, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tally = {"hit": 0, "miss": 0, "false alarm": 0, "right": 0}
shaped = healthy = 0
for case in cases:
    kind, nodes = case.split("@")
    text = open(f"{out}/{kind}-{nodes}.txt").read()
    firsts = sorted({int(m) for m in re.findall(r": run (\d+) of \d+: time", text)})  # the first run after each
    if kind == "healthy":
        healthy += 1
        verdict = "false alarm" if firsts or "exit 0" not in text else "right"
    else:
        shaped += 1
        verdict = ("miss" if not firsts else "hit" if all(abs(f - k) <= 1 for f in firsts) and "exit 1" in text
                   else "false alarm")
    tally[verdict] += 1
    print(f"{case}: change points at runs {firsts or 'none'} (shaped from run {k} on: {kind != 'healthy'}) -> {verdict}")
alarms = tally["false alarm"]
print(f"validate-history: {shaped} shaped case(s): {tally['hit']} found at the right run, {tally['miss']} missed; "
      f"{healthy} healthy: {tally['right']} without a change point; {alarms} false alarm(s) in {len(cases)} cases")
sys.exit(0 if tally["hit"] + tally["right"] == len(cases) else 1)
PY
