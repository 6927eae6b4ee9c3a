#!/usr/bin/env bash
# The regression check with the history's noise model, measured (docs/interconnect.md,
# "Regression check"): the nightly job's steps (slurm/interconnect.sbatch: RUNS runs of
# collective_perf into a folder of their own, analysis/regress.py against the baseline with
# --history, then analysis/history.py add), one check after the other on this machine.
#   scripts/validate-regress.sh loopback [OUT]   2 ranks of one host (shared memory): a baseline
#       of BASE_RUNS runs, HIST checks into the history, then TRIALS unchanged checks, each
#       judged with the history of every check before it; NOISE=2 runs every collective_perf
#       under scripts/with-noise.sh -n 2 (the baseline and the history too),
#       TRIAL_NOISE=2 only the trials' (an idle history, a loaded check)
#   scripts/validate-regress.sh shaped [OUT]     2 emulated hosts of 1 rank (scripts/local-cluster.sh,
#       links at RATE Mbit/s: root, the cluster down, run it under flock /run/sb-cluster.lock):
#       baseline, HIST checks, TRIALS unchanged checks, then SLOWED checks with node2's link
#       shaped to RATE/SLOWDOWN (a real slowdown of the link, htb)
#   RUNS=3 BASE_RUNS=4 HIST=10 TRIALS=20 THRESHOLD=0.05 OPS=all-reduce,all-gather MIN=1M MAX=4M
#   ITERS=20 RATE=400 SLOWDOWN=1.3 SLOWED=5 NOISE=0 TRIAL_NOISE=NOISE CONFIRM=1 (environment)
# Prints one line per trial (exit status of regress.py, its summary) and the count of each
# exit status; OUT (default build/validate-regress/MODE) keeps the runs, the history and
# every regress output. Exit 0 when it ran (the figures are the result), 1 when a step failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:?usage: scripts/validate-regress.sh loopback|shaped [OUT]}
case $MODE in loopback|shaped) ;; *) echo "validate-regress: MODE must be loopback or shaped, not '$MODE'" >&2; exit 2 ;; esac
OUT=${2:-$ROOT/build/validate-regress/$MODE}
RUNS=${RUNS:-3} BASE_RUNS=${BASE_RUNS:-4} HIST=${HIST:-10} TRIALS=${TRIALS:-20} THRESHOLD=${THRESHOLD:-0.05}
OPS=${OPS:-all-reduce,all-gather} MIN=${MIN:-1M} MAX=${MAX:-4M} ITERS=${ITERS:-20}
RATE=${RATE:-400} SLOWDOWN=${SLOWDOWN:-1.3} NOISE=${NOISE:-0} SLOWED=${SLOWED:-5} TRIAL_NOISE=${TRIAL_NOISE:-${NOISE:-0}}
CONFIRM=${CONFIRM:-1}
PY=/usr/bin/python3
C=$ROOT/scripts/local-cluster.sh
rm -rf "$OUT" && mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
source "$ROOT/scripts/mpi-env.sh"
export SB_CLUSTER_EAGER=1  # links measured with exchanges both ways: scripts/mpi-env-cluster.sh
if [ "$MODE" = shaped ]; then
  trap '"$C" down >/dev/null 2>&1' EXIT
  "$C" up --nodes 2 --link-mbit "$RATE" >/dev/null || exit 1
  read -ra MPI <<<"timeout 300 mpirun $("$C" mpirun-args --ranks-per-node 1) -np 2"
else
  MPI=(timeout 300 mpirun -np 2 --bind-to none)
fi
QUIET=("${MPI[@]}")
[ "$NOISE" != 0 ] && MPI=("$ROOT/scripts/with-noise.sh" -n "$NOISE" -- "${QUIET[@]}")

# check DIR N: N runs of collective_perf into DIR (one check, or the baseline)
check() {
  mkdir -p "$1" || return 1
  for i in $(seq 1 "$2"); do
    "${MPI[@]}" "$ROOT/build/bin/collective_perf" --ops "$OPS" -b "$MIN" -e "$MAX" -f 4 -n "$ITERS" -w 3 \
      --backend cpu --out "$1/run$i.h5" </dev/null >>"$1.log" 2>&1 || { echo "validate-regress: run failed: $1.log"; return 1; }
  done
}
# regress DIR [FLAGS]: regress.py on DIR against the baseline, with the history so far
regress() {
  local hist=()
  [ -f "$OUT/history.db" ] && hist=(--history "$OUT/history.db")  # as slurm/interconnect.sbatch
  $PY "$ROOT/analysis/regress.py" "$OUT/base" "$1" "${hist[@]}" --threshold "$THRESHOLD" \
    --report-dir "$1-report" "${@:2}" >"$1-regress.txt" 2>&1
}
# judge DIR: regress.py on DIR with the history so far (its exit status in $rc; a flagged check
# is measured again into DIR-recheck and judged with --confirm, as slurm/interconnect.sbatch
# does, unless CONFIRM=0), then DIR into the history
judge() {
  regress "$1"
  rc=$?
  if [ "$rc" = 1 ] && [ "$CONFIRM" = 1 ]; then  # as the job: flagged points measured again
    cp "$1-regress.txt" "$1-regress-unconfirmed.txt"
    check "$1-recheck" "$RUNS" || return 1
    regress "$1" --confirm "$1-recheck"
    rc=$?
  fi
  $PY "$ROOT/analysis/history.py" add "$OUT/history.db" "$1" >/dev/null || return 1
}

echo "validate-regress $MODE: $(uptime | sed 's/.*load/load/'); noise $NOISE (trials $TRIAL_NOISE); $OPS $MIN-$MAX, $ITERS iterations, $RUNS runs a check"
check "$OUT/base" "$BASE_RUNS" || exit 1
for h in $(seq -w 1 "$HIST"); do
  check "$OUT/h$h" "$RUNS" && judge "$OUT/h$h" || exit 1
  printf '\rhistory: check %s/%s (regress exit %s)' "$h" "$HIST" "$rc"
done
echo
# trials PREFIX N LABEL: N checks, each judged against the history, a line each; then the count
# of each exit code, with the load average.
trials() {
  local -A tally=()
  local t
  for t in $(seq -w 1 "$2"); do
    check "$OUT/$1$t" "$RUNS" && judge "$OUT/$1$t" || exit 1
    tally[$rc]=$((${tally[$rc]:-0} + 1))
    echo "$3 $t: exit $rc: $(grep '^regress: ' "$OUT/$1$t-regress.txt" | grep -v '^regress: wrote\|not counted' | head -n 1 | cut -c 10-)"
  done
  summary=$(for k in 0 1 2 3; do printf 'exit %s: %s of %s; ' "$k" "${tally[$k]:-0}" "$2"; done)
}
if [ "$TRIAL_NOISE" != "$NOISE" ]; then
  MPI=("${QUIET[@]}")
  [ "$TRIAL_NOISE" != 0 ] && MPI=("$ROOT/scripts/with-noise.sh" -n "$TRIAL_NOISE" -- "${QUIET[@]}")
fi
trials t "$TRIALS" trial
echo "validate-regress $MODE, unchanged: $summary$(uptime | sed 's/.*load/load/')"
[ "$MODE" = shaped ] || exit 0
"$C" shape node2="$(awk "BEGIN { printf \"%d\", $RATE / $SLOWDOWN }")" >/dev/null || exit 1
trials s "$SLOWED" slowed
echo "validate-regress $MODE, node2's link at 1/$SLOWDOWN: $summary$(uptime | sed 's/.*load/load/')"
