#!/usr/bin/env bash
# The projection against runs across emulated links (docs/projection.md, "Across emulated
# links"): hosts of this machine (scripts/local-cluster.sh), each node's link shaped to RATE
# Mbit/s, 2 ranks a node, described by runs/clusters/emulated-4node.toml.
#   1. calibration, from runs that are not validated: compute from a DDP run of 8 ranks on
#      this host (no links), [inter] from collective_perf on the 4 and on the 2 shaped nodes of
#      2 ranks, blocking and --nonblocking (a fit per operation, group shape and mode: the CPU
#      backend makes a collective waited for at once one blocking call, and MPI runs the two
#      modes with different algorithms), [intra] from both on one node's 2 ranks;
#   2. DDP, FSDP full and hybrid (one group a node) on 2 and 4 nodes, REPEAT runs each, and
#      their projections: analysis/validate_projection.py compares the medians, requires
#      MAX_ERROR and the measured order;
#   3. the layout advisor on the same description (8 ranks, global batch 16, no pipelines:
#      docs/projection.md says why): its top 5 by the full replay run for real, REPEAT times
#      of ADVISOR_STEPS steps; its pick must be the measured fastest or within PICK_MARGIN of it;
#   4. collective_perf across 4 nodes of 1 rank: busbw within 10 % of what the shaped rate
#      allows (TCP's payload in a 1500-byte MTU's frames: 1448 of 1514 bytes, the tbf's count).
# Usage: scripts/validate-emulated.sh OUT_DIR   (root; OUT_DIR not under /tmp, which each node
# has its own of). Environment: RATE (100), REPEAT (3), STEPS (5), MAX_ERROR (0.15),
# PICK_MARGIN (0.05). About 10 minutes on 2 cores. Exit 0 when every claim holds, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/mpi-env.sh
OUT=$(mkdir -p "${1:?usage: scripts/validate-emulated.sh OUT_DIR}" && cd "$1" && pwd) || exit 2
case $OUT/ in /tmp/*) echo "validate-emulated: $OUT is under /tmp, which each node has its own of" >&2; exit 2 ;; esac
RATE=${RATE:-100} REPEAT=${REPEAT:-3} STEPS=${STEPS:-5} MAX_ERROR=${MAX_ERROR:-0.15} PICK_MARGIN=${PICK_MARGIN:-0.05}
ADVISOR_STEPS=${ADVISOR_STEPS:-10}
C=$ROOT/scripts/local-cluster.sh B=$ROOT/build/bin PY=/usr/bin/python3
CLUSTER=$ROOT/runs/clusters/emulated-4node.toml
SHAPE=(--model t5-tiny --d-model 256 --d-ff 1024 --seq-len 32 --dec-seq-len 32)
RUN=("${SHAPE[@]}" --steps "$STEPS" --warmup 1)
trap '"$C" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM
T0=$SECONDS
say() { echo "validate-emulated [$((SECONDS - T0)) s]: $*"; }
failed=0
CALIBRATE=(--calibrate-run calibration/compute-w8.h5)
for f in inter-blocking-w8 inter-nonblocking-w8 inter-blocking-w4 inter-nonblocking-w4 intra-blocking-w2 \
  intra-nonblocking-w2; do CALIBRATE+=(--calibrate-collectives "calibration/$f.h5"); done
mkdir -p "$OUT/calibration" "$OUT/measured" "$OUT/projected" "$OUT/advisor"
cd "$OUT" || exit 2

say "calibration: compute from DDP on 8 ranks of this host"
mpirun -np 8 --bind-to none "$B/ddp_perf" "${RUN[@]}" --batch 2 --out calibration/compute-w8.h5 --overwrite >/dev/null ||
  { echo "calibration run failed"; exit 1; }

# name program flags: the validated strategies
STRATEGIES=("ddp ddp_perf" "fsdp-full fsdp_perf --sharding full" "fsdp-hybrid2 fsdp_perf --sharding hybrid")
for nodes in 2 4; do  # 4 last: the advisor needs both shapes' calibration
  say "$nodes nodes at $RATE Mbit/s"
  "$C" up --nodes "$nodes" --link-mbit "$RATE" >/dev/null || exit 1
  read -ra MPI <<<"mpirun $("$C" mpirun-args --ranks-per-node 2)"
  for mode in blocking nonblocking; do
    say "calibration: collective_perf ($mode) on $nodes nodes x 2 ranks"
    nb=()
    [ "$mode" = nonblocking ] && nb=(--nonblocking)
    "${MPI[@]}" -np $((2 * nodes)) "$B/collective_perf" -b 256K -e 8M -f 4 -n 3 -w 1 "${nb[@]}" \
      --ops all-reduce,all-gather,reduce-scatter --out "calibration/inter-$mode-w$((2 * nodes)).h5" --overwrite \
      </dev/null >/dev/null || exit 1
    if [ "$nodes" = 2 ]; then
      "${MPI[@]}" -np 2 "$B/collective_perf" -b 256K -e 8M -f 4 -n 5 -w 1 "${nb[@]}" \
        --ops all-reduce,all-gather,reduce-scatter --out "calibration/intra-$mode-w2.h5" --overwrite </dev/null >/dev/null ||
        exit 1
    fi
  done
  for rep in $(seq "$REPEAT"); do
    for entry in "${STRATEGIES[@]}"; do
      read -r name prog flags <<<"$entry"
      # shellcheck disable=SC2086  # flags are words
      "${MPI[@]}" -np $((2 * nodes)) "$B/$prog" "${RUN[@]}" --batch 2 $flags \
        --out "measured/$name-w$((2 * nodes))-r$rep.h5" --overwrite </dev/null >/dev/null || { echo "FAIL: $name on $nodes nodes"; failed=1; }
    done
    say "  repeat $rep of $REPEAT done"
  done
  if [ "$nodes" = 4 ]; then
    say "the advisor's top 5 by its full replay, run for real"
    $PY "$ROOT/analysis/advise.py" --cluster "$CLUSTER" "${SHAPE[@]}" --gpus 8 --global-batch 16 --no-offload --pp 1 \
      "${CALIBRATE[@]}" --out advisor --overwrite </dev/null >advisor/advise.txt 2>&1 ||
      { tail -n 3 advisor/advise.txt; exit 1; }
    # the five fastest by replay: "NAME PROGRAM FLAGS..."
    $PY - "$ROOT" advisor/advise.csv >advisor/top5.txt <<'EOF' || exit 1
import csv, sys
sys.path.insert(0, sys.argv[1] + "/analysis")
import advise
rows = [r for r in csv.DictReader(open(sys.argv[2])) if r["replay_step_s"] not in ("", "nan")]
for r in sorted(rows, key=lambda r: float(r["replay_step_s"]))[:5]:
    program, flags = advise.parse_name(r["layout"], 8, 16).flags(2, 8)
    print(r["layout"], r["replay_step_s"], program, " ".join(flags))
EOF
    while read -r name replay prog flags; do
      for rep in $(seq "$REPEAT"); do
        # shellcheck disable=SC2086
        "${MPI[@]}" -np 8 "$B/$prog" "${SHAPE[@]}" --steps "$ADVISOR_STEPS" --warmup 2 $flags \
          --out "advisor/$name-r$rep.h5" --overwrite </dev/null >/dev/null ||
          { echo "FAIL: $name"; failed=1; }
      done
    done <advisor/top5.txt
    say "collective_perf on 4 nodes of 1 rank (busbw against the link)"
    read -ra MPI1 <<<"mpirun $("$C" mpirun-args --ranks-per-node 1)"
    "${MPI1[@]}" -np 4 "$B/collective_perf" -b 8M -e 32M -f 4 -n 5 -w 1 --ops all-reduce,all-gather,reduce-scatter \
      --out calibration/busbw-w4.h5 --overwrite </dev/null >collectives-w4.txt || failed=1
  fi
  "$C" down >/dev/null
done

say "projection of the validated points"
$PY "$ROOT/analysis/project.py" --cluster "$CLUSTER" "${SHAPE[@]}" --strategies ddp,fsdp-full,fsdp-hybrid --gpus 4,8 \
  --batch 2 "${CALIBRATE[@]}" --require-calibration --out projected --overwrite | tee projected.txt || exit 1
$PY "$ROOT/analysis/validate_projection.py" --measured measured --projected projected --max-error "$MAX_ERROR" --same-order |
  tee validate.txt
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
# The figure: each point's measured runs (median, range) and its projection.
$PY - <<'EOF' || failed=1
import glob, statistics
import h5py
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
def read(folder):
    out = {}
    for p in glob.glob(f"{folder}/*.h5"):
        a = h5py.File(p, "r").attrs
        out.setdefault((str(a["label"]), int(a["world_size"])), []).append(float(a["median_step_time_s"]) * 1e3)
    return out
meas, proj = read("measured"), read("projected")
fig, ax = plt.subplots(figsize=(7, 4))
for i, (label, color) in enumerate((("ddp", "C0"), ("fsdp-full", "C1"), ("fsdp-hybrid2", "C2"))):
    for j, w in enumerate((4, 8)):
        x = j * 4 + i
        m = meas.get((label, w), [])
        if m:
            mid = statistics.median(m)
            ax.errorbar(x, mid, yerr=[[mid - min(m)], [max(m) - mid]], fmt="o", color=color, capsize=4,
                        label=f"{label} measured" if j == 0 else None)
        if (label, w) in proj:
            ax.plot(x, proj[(label, w)][0], "x", color=color, markersize=10, label=f"{label} projected" if j == 0 else None)
ax.set_xticks([1, 5], ["2 nodes x 2 ranks", "4 nodes x 2 ranks"])
ax.set_ylabel("step time (ms)")
ax.set_title("measured against projected across emulated links (100 Mbit/s a node)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("emulated_links.png", dpi=110)
print("validate-emulated: wrote emulated_links.png")
EOF

say "the advisor's pick against its top 5 measured"
$PY - advisor/top5.txt "$PICK_MARGIN" <<'EOF' | tee advisor.txt
import glob, statistics, sys
import h5py
top = [line.split()[:2] for line in open(sys.argv[1])]
measured = {}
for name, replay in top:
    runs = [h5py.File(p, "r").attrs["median_step_time_s"] for p in glob.glob(f"advisor/{name}-r*.h5")]
    measured[name] = statistics.median(runs)
    print(f"{name:<40} replay {float(replay) * 1e3:8.1f} ms  measured {measured[name] * 1e3:8.1f} ms "
          f"({len(runs)} runs, {min(runs) * 1e3:.1f}-{max(runs) * 1e3:.1f})")
pick, best = top[0][0], min(measured, key=measured.get)
gap = measured[pick] / measured[best] - 1
ok = gap <= float(sys.argv[2])
print(f"advisor: pick {pick} measured {measured[pick] * 1e3:.1f} ms; fastest measured {best} {measured[best] * 1e3:.1f} ms; "
      f"{gap:+.1%}: {'holds' if ok else 'FAILS'} (margin {float(sys.argv[2]):.0%})")
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1

say "busbw across 4 nodes against the link ($RATE Mbit/s = $(awk -v r="$RATE" 'BEGIN{print r / 8000}') GB/s)"
$PY - calibration/busbw-w4.h5 "$RATE" <<'EOF' | tee busbw.txt
import sys
import h5py
f = h5py.File(sys.argv[1], "r")
names = [n.decode() if isinstance(n, bytes) else n for n in f["results"].attrs["op_names"]]
rate = float(sys.argv[2]) / 8000       # GB/s on the wire
allows = rate * 1448 / 1514            # TCP payload per Ethernet frame of a 1500-byte MTU
worst = 0.0
for r in f["results"][()]:
    if r["in_place"] == 0 and r["size"] == max(f["results"]["size"]):
        share = r["busbw"] / allows
        worst = max(worst, abs(share - 1))
        print(f"{names[r['op']]:<15} {r['size'] / 2**20:5.0f} MiB busbw {r['busbw']:.5f} GB/s = {share:.1%} of the "
              f"{allows:.5f} GB/s the link allows ({r['busbw'] / rate:.1%} of its rate)")
print(f"busbw: within {worst:.1%} of what the link allows: {'holds' if worst <= 0.10 else 'FAILS'} (10 %)")
sys.exit(0 if worst <= 0.10 else 1)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
say "done: $([ "$failed" = 0 ] && echo "every claim holds" || echo "a claim FAILS")"
exit "$failed"
