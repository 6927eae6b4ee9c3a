#!/usr/bin/env bash
# The projection against runs across emulated links (docs/projection.md, "Across emulated
# links"): hosts of this machine (scripts/local-cluster.sh), each node's link shaped to RATE
# Mbit/s, 2 ranks a node, described by runs/clusters/emulated-4node.toml.
#   1. calibration, from runs that are not validated: compute from a DDP run of 8 ranks on
#      this host (no links), [inter] from collective_perf on the 4 and on the 2 shaped nodes of
#      2 ranks, blocking and --nonblocking, at the sizes the points' plans issue (size_range) (a fit per operation, group shape and mode: the CPU
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
# has its own of); with --seed or --cases, the matrix of drawn cases below (matrix_main). Environment: RATE (100), REPEAT (3), STEPS (5), MAX_ERROR (0.15),
# PICK_MARGIN (0.05). About 10 minutes on 2 cores. Exit 0 when every claim holds, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/mpi-env.sh
: "${1:?usage: scripts/validate-emulated.sh OUT_DIR [--seed N [--count K] | --cases FILE] [--project-only]}"
# Every flag is checked before OUT is made: bad input leaves nothing behind.
M_SEED="" M_COUNT=12 M_CASES="" M_PROJECT_ONLY=0
if [ $# -gt 1 ]; then
  args=("${@:2}")
  while [ ${#args[@]} -gt 0 ]; do
    case ${args[0]} in
      --seed) [[ ${args[1]:-} =~ ^[0-9]+$ ]] || { echo "validate-emulated: --seed '${args[1]:-}' must be an integer >= 0" >&2; exit 2; }
              M_SEED=${args[1]}; args=("${args[@]:2}") ;;
      --count) [[ ${args[1]:-} =~ ^[1-9][0-9]*$ ]] && [ "${args[1]}" -le 100 ] ||
                 { echo "validate-emulated: --count '${args[1]:-}' must be an integer from 1 to 100" >&2; exit 2; }
               M_COUNT=${args[1]}; args=("${args[@]:2}") ;;
      --cases) [ -f "${args[1]:-}" ] || { echo "validate-emulated: --cases '${args[1]:-}': no such file" >&2; exit 2; }
               M_CASES=$(cd "$(dirname "${args[1]}")" && pwd)/$(basename "${args[1]}"); args=("${args[@]:2}") ;;
      --project-only) M_PROJECT_ONLY=1; args=("${args[@]:1}") ;;
      *) echo "validate-emulated: unknown argument '${args[0]}' (allowed: --seed N, --count K, --cases FILE, --project-only)" >&2
         exit 2 ;;
    esac
  done
  [ -n "$M_SEED" ] || [ -n "$M_CASES" ] || { echo "validate-emulated: give --seed N or --cases FILE" >&2; exit 2; }
  [ -z "$M_SEED" ] || [ -z "$M_CASES" ] || { echo "validate-emulated: give --seed or --cases, not both" >&2; exit 2; }
fi
case $(realpath -m "$1")/ in /tmp/*) echo "validate-emulated: $1 is under /tmp, which each node has its own of" >&2; exit 2 ;; esac
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
RATE=${RATE:-100} REPEAT=${REPEAT:-3} STEPS=${STEPS:-5} MAX_ERROR=${MAX_ERROR:-0.15} PICK_MARGIN=${PICK_MARGIN:-0.05}
ADVISOR_STEPS=${ADVISOR_STEPS:-10}
C=$ROOT/scripts/local-cluster.sh B=$ROOT/build/bin PY=/usr/bin/python3
CLUSTER=$ROOT/runs/clusters/emulated-4node.toml
SHAPE=(--model t5-tiny --d-model 256 --d-ff 1024 --seq-len 32 --dec-seq-len 32)
RUN=("${SHAPE[@]}" --steps "$STEPS" --warmup 1)
# The cluster is brought down on exit only by whoever brought it up (HOLDING): an exit before
# that (bad input, the cases' draw, an interrupt) leaves another job's cluster alone. The fixed
# validation runs under its caller's lock; the matrix (LOCK) holds it only during a case's
# measurements.
HOLDING=0
trap '[ "$HOLDING" = 1 ] && "$C" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM
T0=$SECONDS
say() { echo "validate-emulated [$((SECONDS - T0)) s]: $*"; }
# The sizes a calibration measures: collective_perf's -b and -e (-f 4) from at or below the
# smallest collective the points' plans issue to at or above the largest (project.py
# --collective-sizes; arguments: its point flags), so that no fit is used beyond its sizes.
# The ladder ends at the largest size (rounded up to a multiple of its step, under 1 % above):
# rounding it up to a power of 4 measured up to 4x more bytes, minutes on a slow link.
size_range() {
  local lo hi k=1 e b
  read -r _ lo hi < <($PY "$ROOT/analysis/project.py" "$@" --batch 2 --collective-sizes | grep '^sizes ')
  [ -n "${hi:-}" ] || return 1
  [ "$lo" -ge 256 ] || lo=256
  while [ $((hi / k)) -gt "$lo" ]; do k=$((k * 4)); done  # 4^k steps from below lo to hi
  e=$(((hi + 4 * k - 1) / (4 * k) * 4 * k)) b=$((e / k))  # whole fp32 elements at every size
  echo "$b $e"
}

# ---------------------------------------------------------------- the matrix (--cases, --seed)
# Usage: scripts/validate-emulated.sh OUT_DIR --seed N [--count K]   (draw K cases, default 12)
#        scripts/validate-emulated.sh OUT_DIR --cases FILE           (a case list: the drawn lines)
#        ... --project-only   (re-project and compare the cases already measured in OUT_DIR)
# A case: `case NAME nodes=N rpn=R shape=all|nodeI|nodeA-nodeB rate=MBIT d_model=D layers=L
# vocab=V strategies=S1,S2,...` (t5-small's blocks at that width, d_ff 4D, D/64 heads of 64,
# seq 32, batch 2). Each case is calibrated by its own runs, as docs/projection.md (d) says:
# compute from DDP on the case's ranks on one node (no links), right before its runs; collective_perf across the
# shaped nodes at the case's group shape, blocking and --nonblocking, at the sizes its plans
# issue (project.py --collective-sizes), plus each node's 2 ranks and the 1-rank-a-node
# replicate groups (hybrid, TP) where the case has them, every such group at once
# (collective_perf --groups, as the runs run them); then every strategy REPEAT times,
# projected and compared (validate_projection.py --max-error MAX_ERROR --same-order).
# LOCK (a file, e.g. /run/sb-cluster.lock): each case's cluster part runs under flock on it,
# so a long matrix never holds the shared cluster more than one case at a time.
# Environment: MATRIX_REPEAT (2), MATRIX_STEPS (3), MATRIX_WARMUP (2: on 10-12 ranks the first
# timed step after one warm-up step was still up to 2x the later ones), MAX_ERROR (0.15), BUDGET_S (3.0: a drawn case whose
# estimated step exceeds it is drawn again: the matrix's time on 2 cores; printed).
# Exit 0 when every case holds, 1 when one misses (each is reported, none dropped), 2 bad input,
# 77 where network namespaces cannot be made (tests/run_tests.sh counts it as skipped).
matrix_main() {  # the flags, checked at the top (M_*)
  local seed=$M_SEED count=$M_COUNT cases=$M_CASES project_only=$M_PROJECT_ONLY
  REPEAT=${MATRIX_REPEAT:-2} STEPS=${MATRIX_STEPS:-3} WARMUP=${MATRIX_WARMUP:-2} BUDGET_S=${BUDGET_S:-3.0}
  mkdir -p "$OUT/cases" || exit 2
  if [ -n "$seed" ]; then
    say "drawing $count cases with seed $seed (re-run: $0 $OUT --seed $seed --count $count; or --cases $OUT/cases.txt)"
    $PY - "$ROOT" "$seed" "$count" "$BUDGET_S" >"$OUT/cases.txt" <<'PYEOF' || exit 2
import random, sys
sys.path.insert(0, sys.argv[1] + "/analysis")
import runner
rng, count, budget = random.Random(int(sys.argv[2])), int(sys.argv[3]), float(sys.argv[4])
# Seconds a step of 19 M parameters computes on 6 ranks of this machine (DDP, seq 32, batch 2,
# measured 0.65 s) scale by parameters and ranks; the link moves FSDP full's 1.5x DDP's bytes.
out = []
while len(out) < count:
    nodes, rpn = rng.randint(2, 6), rng.choice((1, 2))
    rate = int(round(50 * (20 ** rng.random()), -1))  # 50 to 1,000 Mbit/s, log-uniform
    kind = rng.choice(("all", "node", "path"))
    if kind == "node":
        shape = f"node{rng.randint(1, nodes)}"
    elif kind == "path":
        a, b = sorted(rng.sample(range(1, nodes + 1), 2))
        shape = f"node{a}-node{b}"
    else:
        shape = "all"
    d, layers, vocab = rng.choice((128, 256, 384, 512, 640)), rng.randint(1, 4), rng.choice((4096, 8192, 16384, 32128))
    pool = ["ddp", "fsdp-full", "fsdp-grad-op", "fsdp-optimizer-state"]
    if rpn == 2:
        pool += ["fsdp-hybrid", "ddp-tp2", "fsdp-full-tp2"]
    strategies = rng.sample(pool, 3)
    world = nodes * rpn
    flags = ["--model", "t5-small", "--d-model", str(d), "--d-ff", str(4 * d), "--layers", str(layers),
             "--heads", str(d // 64), "--d-kv", "64", "--vocab", str(vocab), "--batch", "2", "--seq-len", "32",
             "--plan", "--world-size", str(world)]
    params = runner.schedule("ddp_perf", flags, sys.argv[1] + "/build/bin")["param_count"]
    est = 0.65 * params / 19e6 * world / 6 + 1.5 * 2 * params * 4 / (rate * 1e6 / 8)
    name = f"c{len(out) + 1:02d}"
    if not 2e6 <= params <= 40e6 or est > budget:
        print(f"# redrawn: {nodes} nodes x {rpn}, {rate} Mbit/s, {params / 1e6:.1f} M parameters: estimated step "
              f"{est:.1f} s (limits: 2-40 M parameters, {budget:g} s)")
        continue
    out.append(f"case {name} nodes={nodes} rpn={rpn} shape={shape} rate={rate} d_model={d} layers={layers} "
               f"vocab={vocab} strategies={','.join(strategies)}  # {params / 1e6:.1f} M parameters, estimated {est:.1f} s")
print("\n".join(out))
PYEOF
    cases=$OUT/cases.txt
  fi
  grep -v '^#' "$cases" | grep -q '^case ' || { echo "validate-emulated: $cases has no 'case' line" >&2; exit 2; }
  say "cases ($cases):"
  grep '^case ' "$cases"
  local failed=0 line
  while read -r line; do
    case $line in case\ *) ;; *) continue ;; esac
    matrix_case ${line%%#*} </dev/null || failed=1
  done <"$cases"
  say "matrix: every case against its projection"
  $PY - "$OUT/cases" <<'PYEOF'
import glob, os, sys
rows = [open(p).read().strip() for p in sorted(glob.glob(os.path.join(sys.argv[1], "*", "verdict.txt")))]
print("\n".join(rows))
PYEOF
  say "done: $([ "$failed" = 0 ] && echo "every case holds (within $MAX_ERROR, the measured order)" || echo "a case MISSES")"
  exit "$failed"
}

# A case's measurements on its emulated cluster (matrix_case's variables): the collectives at
# its group shapes and sizes, then every strategy REPEAT times.
matrix_cluster() {
  "$C" up --nodes "$nodes" "${shape_flags[@]}" >/dev/null
  case $? in
    0) HOLDING=1 ;;
    3) echo "validate-emulated: skipped: network namespaces cannot be made here (local-cluster.sh exit 3)"; exit 77 ;;
    *) echo "case $name: no cluster"; return 1 ;;
  esac
  local mpi mode nb t0=$SECONDS
  read -ra mpi <<<"mpirun $("$C" mpirun-args --ranks-per-node "$rpn")"
  # compute: DDP with every rank on node1 (no links), beside the runs it calibrates: on a
  # machine shared with other work, a calibration minutes away measured another load
  local mpia
  read -ra mpia <<<"mpirun $("$C" mpirun-args --ranks-per-node "$world")"
  "${mpia[@]}" -np "$world" "$B/ddp_perf" "${model[@]}" --batch 2 --steps 5 --warmup 1 \
    --out "$dir/calibration/compute.h5" --overwrite </dev/null >/dev/null || { echo "case $name: calibration run failed"; return 1; }
  local cp=("$B/collective_perf" -b "$b" -e "$e" -f 4 -n 3 -w 1 --ops all-reduce,all-gather,reduce-scatter --overwrite)
  for mode in blocking nonblocking; do
    nb=()
    [ "$mode" = nonblocking ] && nb=(--nonblocking)
    "${mpi[@]}" -np "$world" "${cp[@]}" "${nb[@]}" --out "$dir/calibration/coll-$mode-w$world.h5" >/dev/null || return 1
    # Each node's 2 ranks; and the groups of one rank a node (hybrid's replicas, TP's data):
    # every such group at once (--groups), as the runs run them: the nodes' groups share this
    # machine's cores, and a node's link carries both its replicate groups' flows; each
    # iteration started by all together (--barrier: groups drifting out of phase shared less).
    if [ "$rpn" = 2 ]; then
      "${mpi[@]}" -np "$world" "${cp[@]}" "${nb[@]}" --groups shard --barrier --out "$dir/calibration/coll-intra-$mode-w2.h5" \
        >/dev/null || return 1
      if [[ $strategies == *hybrid* || $strategies == *tp2* ]]; then
        "${mpi[@]}" -np "$world" "${cp[@]}" "${nb[@]}" --groups replicate --barrier \
          --out "$dir/calibration/coll-rep-$mode-w$nodes.h5" >/dev/null || return 1
      fi
    fi
  done
  say "  case $name: collectives ${b}-${e} bytes measured ($((SECONDS - t0)) s)"
  local rep label prog flags
  for rep in $(seq "$REPEAT"); do
    while read -r label prog flags; do
      # shellcheck disable=SC2086  # flags are words
      "${mpi[@]}" -np "$world" "$B/$prog" "${model[@]}" --batch 2 --steps "$STEPS" --warmup "$WARMUP" $flags \
        --out "$dir/measured/$label-r$rep.h5" --overwrite </dev/null >/dev/null || { echo "case $name: $label failed"; return 1; }
    done < <($PY -c "import sys; sys.path.insert(0, '$ROOT/analysis'); import strategy_labels as s
for l in '$strategies'.split(','):
    p, f, _ = s.resolve(l, $rpn, $world); print(l, p, ' '.join(f))")
  done
  say "  case $name: measured ($((SECONDS - t0)) s on the cluster)"
}

# One case: matrix_case case NAME key=value...
matrix_case() {
  local name=$2 nodes rpn shape rate d_model layers vocab strategies kv
  shift 2
  for kv in "$@"; do
    case $kv in
      nodes=*|rpn=*|shape=*|rate=*|d_model=*|layers=*|vocab=*|strategies=*) local "${kv%%=*}=${kv#*=}" ;;
      *) echo "validate-emulated: case $name: unknown field '$kv'" >&2; return 1 ;;
    esac
  done
  local world=$((nodes * rpn)) dir=$OUT/cases/$name
  local shape_flags=(--link-mbit "$rate")
  case $shape in
    all) ;;
    node[0-9]*-node[0-9]*) shape_flags=(--slow-path "$shape=$rate") ;;
    node[0-9]*) shape_flags=(--slow "$shape=$rate") ;;
    *) echo "validate-emulated: case $name: shape '$shape' (allowed: all, nodeI, nodeA-nodeB)" >&2; return 1 ;;
  esac
  local model=(--model t5-small --d-model "$d_model" --d-ff $((4 * d_model)) --layers "$layers" --heads $((d_model / 64))
               --d-kv 64 --vocab "$vocab" --seq-len 32 --dec-seq-len 32)
  mkdir -p "$dir/calibration" "$dir/measured" "$dir/projected"
  sed -e "s/^name = .*/name = \"emulated-$name\"/" -e "s/^gpus_per_node = .*/gpus_per_node = $rpn/" \
    "$CLUSTER" >"$dir/cluster.toml"
  say "case $name: $nodes nodes x $rpn, $shape at $rate Mbit/s, d_model $d_model, $layers layers, vocab $vocab: $strategies"
  local cal=(--calibrate-run "$dir/calibration/compute.h5")
  # a case measured to the end already (an earlier, interrupted matrix) is projected again only
  if [ "$project_only" = 0 ] && [ ! -e "$dir/measured/.complete" ]; then
    local b e
    read -r b e < <(size_range --cluster "$dir/cluster.toml" "${model[@]}" --strategies "$strategies" --gpus "$world")
    [ -n "$e" ] || { echo "case $name: no collective sizes"; return 1; }
    echo "$b $e" >"$dir/calibration/sizes.txt"
    if [ -n "${LOCK:-}" ]; then exec 9>>"$LOCK" && flock 9; fi  # the shared cluster: this case's part only
    matrix_cluster
    local rc=$?
    "$C" down >/dev/null 2>&1
    HOLDING=0
    if [ -n "${LOCK:-}" ]; then flock -u 9; fi
    [ "$rc" = 0 ] || return 1
    touch "$dir/measured/.complete"
  fi
  local f
  for f in "$dir"/calibration/coll-*.h5; do cal+=(--calibrate-collectives "$f"); done
  $PY "$ROOT/analysis/project.py" --cluster "$dir/cluster.toml" "${model[@]}" --strategies "$strategies" \
    --gpus "$world" --batch 2 "${cal[@]}" --out "$dir/projected" --overwrite >"$dir/projected.txt" 2>&1 ||
    { cat "$dir/projected.txt"; echo "case $name: projection failed"; return 1; }
  cat "$dir/projected.txt"
  $PY "$ROOT/analysis/validate_projection.py" --measured "$dir/measured" --projected "$dir/projected" \
    --max-error "$MAX_ERROR" --same-order >"$dir/validate.txt" 2>&1
  local rc=$?
  cat "$dir/validate.txt"
  { echo "case $name ($nodes nodes x $rpn, $shape at $rate Mbit/s, d_model $d_model, $layers layers, vocab $vocab):" \
      "$(grep -o 'worst |error| .*' "$dir/validate.txt"); $(grep -o 'measured .*: \(same order\|ORDER DIFFERS\)' \
      "$dir/validate.txt" | sed 's/^measured/measured/')$([ $rc = 0 ] && echo ": holds" || echo ": MISSES")"
    grep -E '^(ddp|fsdp)' "$dir/validate.txt" | sed 's/^/    /'; } >"$dir/verdict.txt"
  return $rc
}
[ $# -gt 1 ] && matrix_main  # a case list or a seed: the matrix; else the fixed validation below
failed=0
CALIBRATE=(--calibrate-run calibration/compute-w8.h5)
for f in inter-blocking-w8 inter-nonblocking-w8 inter-blocking-w4 inter-nonblocking-w4 intra-blocking-w2 \
  intra-nonblocking-w2; do CALIBRATE+=(--calibrate-collectives "calibration/$f.h5"); done
mkdir -p "$OUT/calibration" "$OUT/measured" "$OUT/projected" "$OUT/advisor"
cd "$OUT" || exit 2
read -r SIZE_B SIZE_E < <(size_range --cluster "$CLUSTER" "${SHAPE[@]}" --strategies ddp,fsdp-full,fsdp-hybrid --gpus 4,8) ||
  { echo "validate-emulated: no collective sizes from the plans"; exit 1; }
say "calibration sizes from the plans: $SIZE_B to $SIZE_E bytes"

say "calibration: compute from DDP on 8 ranks of this host"
mpirun -np 8 --bind-to none "$B/ddp_perf" "${RUN[@]}" --batch 2 --out calibration/compute-w8.h5 --overwrite >/dev/null ||
  { echo "calibration run failed"; exit 1; }

# name program flags: the validated strategies
STRATEGIES=("ddp ddp_perf" "fsdp-full fsdp_perf --sharding full" "fsdp-hybrid2 fsdp_perf --sharding hybrid")
for nodes in 2 4; do  # 4 last: the advisor needs both shapes' calibration
  say "$nodes nodes at $RATE Mbit/s"
  "$C" up --nodes "$nodes" --link-mbit "$RATE" >/dev/null || exit 1
  HOLDING=1
  read -ra MPI <<<"mpirun $("$C" mpirun-args --ranks-per-node 2)"
  for mode in blocking nonblocking; do
    say "calibration: collective_perf ($mode) on $nodes nodes x 2 ranks"
    nb=()
    [ "$mode" = nonblocking ] && nb=(--nonblocking)
    "${MPI[@]}" -np $((2 * nodes)) "$B/collective_perf" -b "$SIZE_B" -e "$SIZE_E" -f 4 -n 3 -w 1 "${nb[@]}" \
      --ops all-reduce,all-gather,reduce-scatter --out "calibration/inter-$mode-w$((2 * nodes)).h5" --overwrite \
      </dev/null >/dev/null || exit 1
    if [ "$nodes" = 2 ]; then
      "${MPI[@]}" -np 2 "$B/collective_perf" -b "$SIZE_B" -e "$SIZE_E" -f 4 -n 5 -w 1 "${nb[@]}" \
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
  HOLDING=0
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
