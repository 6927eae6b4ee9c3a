#!/usr/bin/env bash
# The history's change points on measured runs (docs/interconnect.md, "History and change
# points"): on the emulated cluster (scripts/local-cluster.sh, 4 nodes, links at RATE
# Mbit/s), RUNS interconnect checks (collective_perf all-reduce and all-gather, 256 KiB and
# 1 MiB) one after the other; from run K on node2's link is shaped to SLOW Mbit/s. Then the
# same number of runs with nothing shaped. analysis/history.py must find the change at K
# (+-1) and nowhere else in the first history, and none in the second.
#   scripts/validate-history.sh [OUT]     (root; the cluster must be down; about 3 minutes)
#   RUNS=16 K=7 RATE=400 SLOW=200 (environment)
# Exit 0 when both hold, 1 otherwise; the two `history.py show` answers are in OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=$ROOT/scripts/local-cluster.sh
OUT=$(mkdir -p "${1:-$ROOT/build/validate-history}" && cd "${1:-$ROOT/build/validate-history}" && pwd) || exit 2
RUNS=${RUNS:-16} K=${K:-7} RATE=${RATE:-400} SLOW=${SLOW:-200}
trap '"$C" down >/dev/null 2>&1' EXIT
source "$ROOT/scripts/mpi-env.sh"
rm -rf "$OUT/shaped" "$OUT/steady" "$OUT"/*.db
"$C" up --nodes 4 --link-mbit "$RATE" >/dev/null || exit 1
read -ra MPI <<<"timeout 300 mpirun $("$C" mpirun-args --ranks-per-node 1)"
for seq in shaped steady; do
  mkdir -p "$OUT/$seq"
  for i in $(seq 1 "$RUNS"); do
    if [ "$seq" = shaped ] && [ "$i" = "$K" ]; then "$C" shape node2="$SLOW" >/dev/null || exit 1; fi
    "${MPI[@]}" -np 4 "$ROOT/build/bin/collective_perf" --ops all-reduce,all-gather -b 256K -e 1M -f 4 -n 8 -w 2 \
      --out "$OUT/$seq/run$(printf %02d "$i").h5" </dev/null >"$OUT/$seq/run$i.log" 2>&1 \
      || { echo "validate-history: $seq run $i failed: $OUT/$seq/run$i.log"; exit 1; }
    printf '\r%s: run %d/%d' "$seq" "$i" "$RUNS"
  done
  echo
  "$C" shape node2="$RATE" >/dev/null
  /usr/bin/python3 "$ROOT/analysis/history.py" add "$OUT/$seq.db" "$OUT/$seq" >/dev/null || exit 1
  /usr/bin/python3 "$ROOT/analysis/history.py" show "$OUT/$seq.db" --plot "$OUT/$seq.png" >"$OUT/$seq.txt" 2>&1
  echo "$seq: history.py show exit $?" >>"$OUT/$seq.txt"
done
/usr/bin/python3 - "$OUT" "$K" <<'PY'
import re, sys
out, k = sys.argv[1], int(sys.argv[2])
shaped, steady = open(f"{out}/shaped.txt").read(), open(f"{out}/steady.txt").read()
# "run N" of the first run after each change, as history.py names it
def firsts(text):
    return sorted({int(m) for m in re.findall(r": run (\d+) of \d+: time", text)})
fs, fq = firsts(shaped), firsts(steady)
ok_shaped = "exit 1" in shaped and len(fs) >= 1 and all(abs(f - k) <= 1 for f in fs)
ok_steady = "exit 0" in steady and not fq
print(f"shaped from run {k}: change points at runs {fs or 'none'} -> {'ok' if ok_shaped else 'FAIL'}")
print(f"nothing shaped: change points at runs {fq or 'none'} -> {'ok' if ok_steady else 'FAIL'}")
sys.exit(0 if ok_shaped and ok_steady else 1)
PY
