#!/usr/bin/env bash
# The diagnosis as a matrix: how often analysis/diagnose.py is right, inconclusive or wrong on
# emulated hosts (scripts/local-cluster.sh) with a known fault, drawn from a seed. Each sweep
# runs as a user would: collective_perf --pattern pairs, diagnose.py, and where it prints a
# re-test (exit 4, unconfirmed candidates) that re-test and the confirming diagnose.
#
#   scripts/validate-diagnose.sh [--seed S] [--cases LIST] [--sweeps N] [--noise N]
#       [--link-mbit R] [--sweep-args "..."] [--diag-args "..."] [--batch SECONDS] [--keep DIR]
#
#   --cases    comma-separated CASE@HOSTS (default healthy@4,node@4,path@4,healthy@5,node@5,path@5,two@5):
#              healthy   nothing shaped: right is exit 0 (healthy);
#              node      one node (drawn) at a quarter of the link rate: right is that node alone;
#              path      one path between two nodes (drawn) at a quarter, both directions
#                        (local-cluster.sh --slow-path): right is that link alone, no node;
#              two       two nodes (drawn) at a quarter: right is those two nodes (5 hosts or more:
#                        with 4, two slow nodes leave one fast pair, which no fleet tells from a
#                        fast link);
#              HOSTS 2..16 (an odd count gives a bye each round)
#   --sweeps   sweeps per case (default 5)
#   --noise N  N busy loops beside each sweep and re-test (scripts/with-noise.sh -n N;
#              default 0)
#   --link-mbit  every link's rate (default 400)
#   --sweep-args collective_perf flags (default "-b 1M -e 4M -f 2 -n 10 -w 2": --repeat keeps its default)
#   --diag-args  diagnose.py flags (default "--threshold 0.25": the emulated links' own spread,
#              docs/interconnect.md)
#   --batch    hold the cluster lock (/run/sb-cluster.lock) at most this long at a time
#              (default 480 s: the cluster is shared); SB_CLUSTER_LOCKED=1: the caller holds it
#   --keep DIR keep every sweep, re-test and diagnosis there (default: a temporary folder, removed)
#
# Prints one line per sweep (case, the drawn fault, first-pass exit, final exit, names, load
# average) and per case: N, right, inconclusive, missed (healthy while shaped), wrong (a wrong
# or extra name: a good node or link drained), and the command to run next.
# A sweep or re-test whose mpirun fails (a node lost) is no verdict: it is said so and run again.
# Exit status: 0 every case right in every sweep; 1 some sweep not right; 2 bad input;
# 3 emulated hosts cannot be made here. Needs root; the cluster must not be held by a crash.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=$ROOT/scripts/local-cluster.sh
BIN=$ROOT/build/bin
PY=/usr/bin/python3
NOISE_TOOL=${SB_NOISE_TOOL:-$(cd "$(dirname "$0")" && pwd)/with-noise.sh}
seed=1 cases=healthy@4,node@4,path@4,healthy@5,node@5,path@5,two@5 sweeps=5 noise=0 rate=400
sweep_args="-b 1M -e 4M -f 2 -n 10 -w 2" diag_args="--threshold 0.25" batch=480 keep=
die() { echo "validate-diagnose: $1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --seed) seed=${2:-}; shift 2 ;;
    --cases) cases=${2:-}; shift 2 ;;
    --sweeps) sweeps=${2:-}; shift 2 ;;
    --noise) noise=${2:-}; shift 2 ;;
    --link-mbit) rate=${2:-}; shift 2 ;;
    --sweep-args) sweep_args=${2:-}; shift 2 ;;
    --diag-args) diag_args=${2:-}; shift 2 ;;
    --batch) batch=${2:-}; shift 2 ;;
    --keep) keep=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $seed =~ ^[0-9]+$ ]] || die "--seed '$seed' is not allowed (a whole number)"
[[ $sweeps =~ ^[1-9][0-9]*$ ]] || die "--sweeps '$sweeps' is not allowed (a whole number >= 1)"
[[ $noise =~ ^[0-9]+$ ]] && [ "$noise" -le 64 ] || die "--noise '$noise' is not allowed (0..64 busy loops)"
[[ $rate =~ ^[1-9][0-9]*$ ]] && [ "$rate" -ge 4 ] || die "--link-mbit '$rate' is not allowed (a whole number >= 4)"
[[ $batch =~ ^[1-9][0-9]*$ ]] || die "--batch '$batch' is not allowed (seconds >= 1)"
declare -a CASES=()
IFS=, read -ra list <<<"$cases"
[ ${#list[@]} -gt 0 ] || die "--cases '' is not allowed (CASE@HOSTS, separated by commas)"
for c in "${list[@]}"; do
  [[ $c =~ ^(healthy|node|path|two)@([0-9]+)$ ]] || die "--cases '$c' is not allowed (healthy, node, path or two, @HOSTS)"
  h=${BASH_REMATCH[2]}
  { [ "$h" -ge 2 ] && [ "$h" -le 16 ]; } || die "--cases '$c': HOSTS must be 2..16"
  [ "${BASH_REMATCH[1]}" = two ] && [ "$h" -lt 5 ] && die "--cases '$c': two bad nodes need 5 hosts or more (see --help)"
  [ "${BASH_REMATCH[1]}" = path ] && [ "$h" -lt 3 ] && die "--cases '$c': a path of its own needs 3 hosts or more"
  CASES+=("$c")
done
[ "$noise" = 0 ] || [ -x "$NOISE_TOOL" ] || die "--noise needs $NOISE_TOOL"
work=${keep:-$ROOT/build/validate-diagnose}  # not under /tmp: each node has a /tmp of its own
case $(realpath -m "$work") in /tmp | /tmp/*) die "--keep '$keep' is not allowed under /tmp (each emulated node has a /tmp of its own: the ranks could not write there)" ;; esac
[ -n "$keep" ] || rm -rf "$work"
mkdir -p "$work" || die "cannot make $work"
source "$ROOT/scripts/mpi-env.sh"
export SB_CLUSTER_EAGER=1  # links measured with exchanges both ways: scripts/mpi-env-cluster.sh
RANDOM=$seed  # every draw below follows from the seed
slow=$((rate / 4))
read -ra SWEEP <<<"--pattern pairs $sweep_args"
read -ra DIAG <<<"$diag_args"
NOISE=()
[ "$noise" = 0 ] || NOISE=("$NOISE_TOOL" -n "$noise" --)

lock_fd=
locked_at=0
take_lock() {  # the shared cluster: one at a time, in batches
  [ "${SB_CLUSTER_LOCKED:-0}" = 1 ] && return 0
  exec {fd}>/run/sb-cluster.lock && flock "$fd" && lock_fd=$fd && locked_at=$SECONDS
}
drop_lock() {  # the cluster comes down only by the one holding it, never while another holds it
  { [ -n "$lock_fd" ] || [ "${SB_CLUSTER_LOCKED:-0}" = 1 ]; } && "$C" down >/dev/null 2>&1
  [ -n "$lock_fd" ] && { flock -u "$lock_fd"; exec {lock_fd}>&-; lock_fd=; }
  return 0
}
trap 'drop_lock; [ -n "$keep" ] || rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

draw_node() { echo "node$((RANDOM % $1 + 1))"; }
# names FILE: what a diagnosis names, "kind name" sorted, joined by ';'
names() { grep -E '^suspect ' "$1" | sed -E 's/^suspect (node|link|link or node) ([^:]+(:[^ :]+)?):.*/\1 \2/' | sort | paste -sd';'; }

declare -A N R INC MISS WRONG FIRST4
FAILED=0
printf '%-10s %-5s %-22s %-6s %-6s %-40s %s\n' case sweep fault first final named load
for c in "${CASES[@]}"; do
  kind=${c%@*} hosts=${c#*@}
  N[$c]=0 R[$c]=0 INC[$c]=0 MISS[$c]=0 WRONG[$c]=0 FIRST4[$c]=0
  i=0
  while [ "$i" -lt "$sweeps" ]; do
    # draw the fault, then make the hosts (in a batch under the lock)
    case $kind in
      healthy) fault=none shape=() want="" ;;
      node) n=$(draw_node "$hosts"); fault="$n=$slow" shape=(--slow "$n=$slow") want="node $n" ;;
      two) n1=$(draw_node "$hosts"); n2=$n1; while [ "$n2" = "$n1" ]; do n2=$(draw_node "$hosts"); done
        fault="$n1,$n2=$slow" shape=(--slow "$n1=$slow" --slow "$n2=$slow")
        want=$(printf 'node %s\nnode %s\n' "$n1" "$n2" | sort | paste -sd';') ;;
      path) a=$((RANDOM % hosts + 1)); b=$a; while [ "$b" = "$a" ]; do b=$((RANDOM % hosts + 1)); done
        [ "$a" -gt "$b" ] && { t=$a; a=$b; b=$t; }
        fault="node$a-node$b=$slow" shape=(--slow-path "node$a-node$b=$slow") want="link node$a:node$b" ;;
    esac
    [ -n "$lock_fd" ] || [ "${SB_CLUSTER_LOCKED:-0}" = 1 ] || take_lock || die "cannot take /run/sb-cluster.lock"
    "$C" down >/dev/null 2>&1
    if ! "$C" up --nodes "$hosts" --link-mbit "$rate" "${shape[@]}" >"$work/up.log" 2>&1; then
      if [ "$("$C" up --nodes 1 >/dev/null 2>&1; echo $?)" = 3 ]; then echo "validate-diagnose: no network namespaces here"; exit 3; fi
      echo "validate-diagnose: local-cluster.sh up failed: $(tail -n 1 "$work/up.log")" >&2; exit 1
    fi
    read -ra MPI <<<"timeout 600 mpirun $("$C" mpirun-args --ranks-per-node 1)"
    i=$((i + 1))
    tag=$work/${kind}${hosts}-$i
    rm -f "$tag".*  "$tag"-retest.h5
    first=- final=-
    if ! "${NOISE[@]}" "${MPI[@]}" -np "$hosts" "$BIN/collective_perf" "${SWEEP[@]}" --out "$tag.h5" </dev/null >"$tag.log" 2>&1; then
      final=sweep-failed
    else
      "$PY" "$ROOT/analysis/diagnose.py" "$tag.h5" "${DIAG[@]}" >"$tag.diag" 2>&1
      first=$? final=$first
      if [ "$first" = 4 ]; then
        pairs=$(sed -nE 's/^next: .*--pairs ([^ ]+) .*/\1/p' "$tag.diag")
        rargs=$(sed -nE 's/^next: .*--pairs [^ ]+ (.*) --out RETEST.h5.*/\1/p' "$tag.diag")
        # shellcheck disable=SC2086  # the flags it printed
        if [ -n "$pairs" ] && "${NOISE[@]}" "${MPI[@]}" -np "$hosts" "$BIN/collective_perf" --pattern pairs --pairs "$pairs" \
             $rargs --out "$tag-retest.h5" </dev/null >>"$tag.log" 2>&1; then
          "$PY" "$ROOT/analysis/diagnose.py" "$tag.h5" --retest "$tag-retest.h5" "${DIAG[@]}" >"$tag.diag2" 2>&1
          final=$?
          cp "$tag.diag2" "$tag.final"
        else
          final=retest-failed
        fi
      fi
      [ -e "$tag.final" ] || cp "$tag.diag" "$tag.final"
    fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [[ $final == *-failed ]]; then  # mpirun lost a node (a cluster taken down beside it): no verdict, run it again
      printf '%-10s %-5s %-22s %-6s %-6s %-40s %s\n' "$c" "$i" "$fault" "$first" "$final" "(not counted: run again)" "$load"
      i=$((i - 1)) FAILED=$((FAILED + 1))
      [ "$FAILED" -le $((sweeps + 3)) ] || { echo "validate-diagnose: $FAILED runs failed; see $tag.log" >&2; exit 1; }
      continue
    fi
    got=$([ -e "$tag.final" ] && names "$tag.final")
    N[$c]=$((N[$c] + 1))
    [ "$first" = 4 ] && FIRST4[$c]=$((FIRST4[$c] + 1))
    if [ "$final" = 1 ]; then
      if [ "$got" = "$want" ]; then R[$c]=$((R[$c] + 1)); else WRONG[$c]=$((WRONG[$c] + 1)); fi
    elif [ "$final" = 0 ]; then
      if [ -z "$want" ]; then R[$c]=$((R[$c] + 1)); else MISS[$c]=$((MISS[$c] + 1)); fi
    else
      INC[$c]=$((INC[$c] + 1))
    fi
    printf '%-10s %-5s %-22s %-6s %-6s %-40s %s\n' "$c" "$i" "$fault" "$first" "$final" "${got:--}" "$load"
    if [ -n "$lock_fd" ] && [ $((SECONDS - locked_at)) -ge "$batch" ]; then drop_lock; sleep 5; fi  # let the others in
  done
done
drop_lock
echo
printf '%-10s %4s %6s %13s %7s %6s %s\n' case N right inconclusive missed wrong "first pass exit 4 (re-tested)"
bad=0
for c in "${CASES[@]}"; do
  printf '%-10s %4s %6s %13s %7s %6s %s\n' "$c" "${N[$c]}" "${R[$c]}" "${INC[$c]}" "${MISS[$c]}" "${WRONG[$c]}" "${FIRST4[$c]}"
  [ "${R[$c]}" = "${N[$c]}" ] || bad=1
done
echo "failed runs (not counted, run again): $FAILED"
echo "seed $seed, $sweeps sweep(s) a case, links $rate Mbit/s (faults at $slow), noise $noise, sweep: $sweep_args, diagnose: $diag_args"
if [ -n "$keep" ]; then
  echo "next: each sweep's files are in $keep (CASE-I.h5, -retest.h5, .diag, .diag2); e.g. $PY analysis/diagnose.py $keep/${CASES[0]%@*}${CASES[0]#*@}-1.h5 $diag_args"
else
  echo "next: --keep DIR to keep the files of each sweep, --sweeps 20 --noise 2 for the documented rates (docs/interconnect.md)"
fi
exit $bad
