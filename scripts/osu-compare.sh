#!/usr/bin/env bash
# collective_perf against OSU Micro-Benchmarks on the same MPI, 2 ranks, paired runs.
#
#   scripts/osu-compare.sh OSU_COLLECTIVE_DIR [ROUNDS] [extra collective_perf flags...]
#   e.g. scripts/osu-compare.sh /tmp/osu/mpi/collective 5
#
# Every (operation, size) is a pair of runs back to back, one OSU run and one collective_perf
# run of that single size, and the pair's order alternates from one size and round to the
# next: a slow phase of the machine (seconds, on a shared VM) then hits one pair, and in
# either order as often, instead of one side's whole sweep. PAIR=sweep runs each side's
# whole size sweep per operation instead (fewer launches; the earlier method).
#
# Both sides time each call alone with a barrier after it (OSU's loop; -z 1 here), with
# $ITERS timed and $WARMUP warm-up iterations (default 30 and 3; OSU's own defaults above
# 8 KiB are 100 and 10), sizes 64 KiB..16 MiB, ranks not bound (the machine is shared;
# BIND=core binds them, for a machine of one's own). OSU's all-gather size is per rank:
# collective_perf's size (the gathered array) / 2.
#
# Printed per operation and size, as collective_perf's bus bandwidth over OSU's (the same
# size and bus factor, so OSU's time over collective_perf's):
#  - the median over rounds of the pair's ratio, with its range (average time per iteration,
#    OSU's statistic);
#  - each side's best round (the least average time of all rounds), the estimate of each
#    side's speed that a machine's slow phases do not reach;
#  - where OSU was built to also print "median BYTES US" lines (the median over iterations
#    of the slowest rank's time; OSU 5.3 prints only averages), the median ratio of those
#    against collective_perf's p50.
set -euo pipefail
cd "$(dirname "$0")/.."
osu=${1:?usage: scripts/osu-compare.sh OSU_COLLECTIVE_DIR [ROUNDS] [collective_perf flags]}
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
for b in osu_allreduce osu_allgather osu_reduce_scatter; do
  [ -x "$osu/$b" ] || { echo "osu-compare: $osu/$b not found (build OSU Micro-Benchmarks first)" >&2; exit 2; }
done
pairing=${PAIR:-size}
case $pairing in size|sweep) ;; *) echo "osu-compare: PAIR=$pairing is not allowed (size or sweep)" >&2; exit 2 ;; esac
source scripts/mpi-env.sh
run=(mpirun -np 2 --bind-to "${BIND:-none}")
iters=${ITERS:-30} warmup=${WARMUP:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sizes=(65536 131072 262144 524288 1048576 2097152 4194304 8388608 16777216)

# One side's run of an operation over [lo, hi] bytes (collective_perf's sizes).
osu_run() {  # op lo hi file
  local bin=osu_allreduce scale=1
  case $1 in all-gather) bin=osu_allgather scale=2 ;; reduce-scatter) bin=osu_reduce_scatter ;; esac
  "${run[@]}" "$osu/$bin" -m "$(( $2 / scale )):$(( $3 / scale ))" -i "$iters" -x "$warmup" -M 268435456 >"$4"
}
sb_run() {  # op lo hi file [flags]
  local op=$1 lo=$2 hi=$3 file=$4
  shift 4
  "${run[@]}" build/bin/collective_perf --ops "$op" -b "$lo" -e "$hi" -f 2 -n "$iters" -w "$warmup" -z 1 -c 1 "$@" \
    --out "$file" >/dev/null
}
pair() {  # order op lo hi tag [flags]: both sides, OSU first when order is even
  local order=$1 op=$2 lo=$3 hi=$4 tag=$5
  shift 5
  if (( order % 2 == 0 )); then
    osu_run "$op" "$lo" "$hi" "$out/osu-$tag.txt"; sb_run "$op" "$lo" "$hi" "$out/sb-$tag.h5" "$@"
  else
    sb_run "$op" "$lo" "$hi" "$out/sb-$tag.h5" "$@"; osu_run "$op" "$lo" "$hi" "$out/osu-$tag.txt"
  fi
}
for r in $(seq 1 "$rounds"); do
  for op in all-reduce all-gather reduce-scatter; do
    if [ "$pairing" = sweep ]; then
      pair "$r" "$op" "${sizes[0]}" "${sizes[-1]}" "$op-$r-all" "$@"
    else
      for i in "${!sizes[@]}"; do pair $(( r + i )) "$op" "${sizes[i]}" "${sizes[i]}" "$op-$r-${sizes[i]}" "$@"; done
    fi
  done
  echo "osu-compare: round $r of $rounds done" >&2
done
/usr/bin/python3 - "$out" "$rounds" "$pairing" <<'EOF'
import glob, statistics, sys
import h5py
out, rounds, pairing = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ops = ("all-reduce", "all-gather", "reduce-scatter")
def osu(path, scale):  # {size: (average, median or None)} in us, collective_perf's sizes
    avg, med = {}, {}
    for line in open(path):
        f = line.split()
        if len(f) == 2 and f[0].isdigit():
            avg[int(f[0]) * scale] = float(f[1])
        elif len(f) == 3 and f[0] == "median":
            med[int(f[1]) * scale] = float(f[2])
    return {k: (v, med.get(k)) for k, v in avg.items()}
def shardbench(path):  # out-of-place: {size: (mean time (-a 1), median iteration (p50))} in us
    with h5py.File(path, "r") as f:
        r = f["results"][()]
    return {int(x["size"]): (x["time"] * 1e6, x["p50"] * 1e6) for x in r[r["in_place"] == 0]}
def merged(pattern, read):  # one round's {size: value} from its files (one per size, or one in all)
    d = {}
    for path in sorted(glob.glob(pattern)):
        d.update(read(path))
    return d
o = {op: [merged(f"{out}/osu-{op}-{r}-*.txt", lambda p: osu(p, 2 if op == "all-gather" else 1))
          for r in range(1, rounds + 1)] for op in ops}
s = {op: [merged(f"{out}/sb-{op}-{r}-*.h5", shardbench) for r in range(1, rounds + 1)] for op in ops}
def table(title, which, best=False):
    head = "OSU best us" if best else "OSU us"
    print(f"{title}\n{'operation':15} {'size':>9} {head:>12} {'shardbench us':>14} {'busbw ratio':>12}"
          + ("" if best else f" {'min':>6} {'max':>6}"))
    worst, low = None, 0
    for op in ops:
        for size in sorted(s[op][0]):
            ot = [x[size][which] for x in o[op]]
            st = [x[size][which] for x in s[op]]
            if best:
                ratio = min(ot) / min(st)
                line = f"{min(ot):>12.2f} {min(st):>14.2f} {ratio:>12.3f}"
            else:
                ratios = [a / b for a, b in zip(ot, st)]
                ratio = statistics.median(ratios)
                line = (f"{statistics.median(ot):>12.2f} {statistics.median(st):>14.2f} {ratio:>12.3f} "
                        f"{min(ratios):>6.2f} {max(ratios):>6.2f}")
            worst = ratio if worst is None else min(worst, ratio)
            low += ratio < 0.95
            print(f"{op:15} {size // 1024:>7}Ki {line}")
    n = sum(len(s[op][0]) for op in ops)
    print(f"worst ratio: {worst:.3f}; {n - low} of {n} points at 0.95 or above "
          f"({rounds} rounds, pairs of one {'size' if pairing == 'size' else 'sweep'})\n")
table("average time per iteration (OSU's statistic), median over rounds of each pair's ratio", 0)
table("best round of each side (least average time)", 0, best=True)
if all(x[size][1] is not None for v in o.values() for x in v for size in x):
    table("median iteration, slowest rank (OSU built to print it; shardbench's p50)", 1)
EOF
