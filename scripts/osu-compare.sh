#!/usr/bin/env bash
# collective_perf against OSU Micro-Benchmarks on the same MPI, 2 ranks, interleaved rounds:
# each round runs osu_allreduce, osu_allgather, osu_reduce_scatter and the same operation
# of collective_perf back to back, so a load change hits both alike. Prints, per operation
# and size, the median over rounds of OSU's average latency, of collective_perf's
# out-of-place time, and of their ratio: collective_perf's bus bandwidth over OSU's
# (the same size and factor, so the inverse ratio of the times). Where OSU was built to
# also print "median BYTES US" lines (the median over iterations of the slowest rank's
# time; OSU 5.3 prints only averages), a second table compares those with collective_perf's
# p50, which a shared machine's descheduling outliers do not swing.
#
#   scripts/osu-compare.sh OSU_COLLECTIVE_DIR [ROUNDS] [extra collective_perf flags...]
#   e.g. scripts/osu-compare.sh /tmp/osu/mpi/collective 5
#
# Both sides time each call alone with a barrier after it (OSU's loop; -z 1 here), with
# $ITERS timed and $WARMUP warm-up iterations (default 30 and 3; OSU's own defaults above
# 8 KiB are 100 and 10), sizes 64 KiB..16 MiB, ranks not bound (the machine is shared;
# BIND=core binds them, for a machine of one's own).
# OSU's all-gather size is per rank: collective_perf's size (the gathered array) / 2.
set -euo pipefail
cd "$(dirname "$0")/.."
osu=${1:?usage: scripts/osu-compare.sh OSU_COLLECTIVE_DIR [ROUNDS] [collective_perf flags]}
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
for b in osu_allreduce osu_allgather osu_reduce_scatter; do
  [ -x "$osu/$b" ] || { echo "osu-compare: $osu/$b not found (build OSU Micro-Benchmarks first)" >&2; exit 2; }
done
source scripts/mpi-env.sh
run=(mpirun -np 2 --bind-to "${BIND:-none}")
iters=${ITERS:-30} warmup=${WARMUP:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for op in all-reduce all-gather reduce-scatter; do
    case $op in
      all-reduce) osu_bin=osu_allreduce sizes=65536:16777216 ;;
      all-gather) osu_bin=osu_allgather sizes=32768:8388608 ;;
      reduce-scatter) osu_bin=osu_reduce_scatter sizes=65536:16777216 ;;
    esac
    "${run[@]}" "$osu/$osu_bin" -m "$sizes" -i "$iters" -x "$warmup" -M 268435456 >"$out/osu-$op-$r.txt"
    "${run[@]}" build/bin/collective_perf --ops "$op" -b 64K -e 16M -f 2 -n "$iters" -w "$warmup" -z 1 -c 1 "$@" \
      --out "$out/sb-$op-$r.h5" >"$out/sb-$op-$r.txt"
  done
  echo "osu-compare: round $r of $rounds done" >&2
done
/usr/bin/python3 - "$out" "$rounds" <<'EOF'
import statistics, sys
import h5py
out, rounds = sys.argv[1], int(sys.argv[2])
def osu(path, scale):  # OSU's average per size; the median too where OSU was built to print it
    avg, med = {}, {}
    for line in open(path):
        f = line.split()
        if len(f) == 2 and f[0].isdigit():
            avg[int(f[0]) * scale] = float(f[1])
        elif len(f) == 3 and f[0] == "median":
            med[int(f[1]) * scale] = float(f[2])
    return avg, med
def shardbench(path):  # out-of-place: mean time (-a 1) and median iteration (p50), in us
    with h5py.File(path, "r") as f:
        r = f["results"][()]
    r = r[r["in_place"] == 0]
    return ({int(x["size"]): x["time"] * 1e6 for x in r}, {int(x["size"]): x["p50"] * 1e6 for x in r})
def table(title, osu_rows, sb_rows):
    print(f"{title}\n{'operation':15} {'size':>9} {'OSU us':>10} {'shardbench us':>14} {'busbw ratio':>12} "
          f"{'min':>6} {'max':>6}")
    worst = None
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        for size in sorted(sb_rows[op][0]):
            o = [x[size] for x in osu_rows[op]]
            s = [x[size] for x in sb_rows[op]]
            ratios = [a / b for a, b in zip(o, s)]
            med = statistics.median(ratios)
            worst = med if worst is None else min(worst, med)
            print(f"{op:15} {size // 1024:>7}Ki {statistics.median(o):>10.2f} {statistics.median(s):>14.2f} "
                  f"{med:>12.3f} {min(ratios):>6.2f} {max(ratios):>6.2f}")
    print(f"worst median ratio: {worst:.3f} ({rounds} rounds)\n")
ops = ("all-reduce", "all-gather", "reduce-scatter")
o = {op: [osu(f"{out}/osu-{op}-{r}.txt", 2 if op == "all-gather" else 1) for r in range(1, rounds + 1)] for op in ops}
s = {op: [shardbench(f"{out}/sb-{op}-{r}.h5") for r in range(1, rounds + 1)] for op in ops}
table("average time per iteration (OSU's statistic)", {k: [x[0] for x in v] for k, v in o.items()},
      {k: [x[0] for x in v] for k, v in s.items()})
if all(x[1] for v in o.values() for x in v):
    table("median iteration, slowest rank (OSU built to print it; shardbench's p50)",
          {k: [x[1] for x in v] for k, v in o.items()}, {k: [x[1] for x in v] for k, v in s.items()})
EOF
