#!/usr/bin/env bash
# Which node, which link: collective_perf --pattern pairs and analysis/diagnose.py on the
# emulated cluster (scripts/local-cluster.sh), against links shaped to a known rate.
#   1. 4 nodes, node3's link at a quarter of the others' rate: the diagnosis names node3 and
#      nothing else; the re-test it prints confirms node3;
#   2. 4 nodes, only the path node2-node4 shaped: it names that link, not a node; the re-test
#      confirms the link;
#   3. 5 nodes (a bye each round), node2 slow: it names node2 alone;
#   4. nothing shaped: it names nothing (exit 0), 5 sweeps in a row;
#   5. the result: every pair once at every size, the latency and each node's own all-reduce
#      (2 ranks a node, rank-matched pairs); the data check catches a corrupted byte;
#   6. bad input: one line, exit 2, no result file.
# Needs root (network namespaces); exit 77 (skipped, never passed) where they cannot be made.
source "$(dirname "$0")/lib.sh"
C=$ROOT/scripts/local-cluster.sh
work=$ROOT/build/pair-sweep-test  # not under /tmp: each node has a /tmp of its own
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
trap '"$C" down >/dev/null 2>&1; rm -rf "$tmp" "$work"' EXIT
trap 'exit 130' INT TERM
T0=$SECONDS
# Latency is not judged here: on 2 cores shared by every node's ranks, an 8-byte exchange takes
# 20 us or 4 ms (a scheduler tick) by where the ranks happen to be scheduled, not by the link.
# Healthy pairs of the emulated links differ by up to +-5 % (the scheduler again): a threshold
# of 25 % keeps the verdict conclusive; the slowed links here take 4x as long.
DIAG=("$PY" "$ROOT/analysis/diagnose.py" --latency-threshold off --threshold 0.25)
# 1 MiB: a size where the shaped link, not the 2 shared cores, sets the time (smaller ones
# spread by +-5 % between healthy pairs: TCP's slow start after each idle gap).
SWEEP=(--pattern pairs -b 1M -e 1M -n 8 -w 2)
RATE=400 SLOW=100

up() {  # up ARGS...: a cluster, and MPI=(mpirun ...) across it (one rank a node unless RPN set)
  "$C" down >/dev/null 2>&1
  if ! "$C" up "$@" >"$tmp/out" 2>&1; then
    if [ "$("$C" up --nodes 1 >/dev/null 2>&1; echo $?)" = 3 ]; then echo "pair_sweep_tests: skipped: no network namespaces here"; exit 77; fi
    bad "up $*"; return 1
  fi
  read -ra MPI <<<"timeout 180 mpirun $("$C" mpirun-args --ranks-per-node "${RPN:-1}" 2>/dev/null)"
}
# sweep NAME NP [FLAGS...]: a pair sweep into $work/NAME.h5
sweep() {
  local name=$1 np=$2
  shift 2
  "${MPI[@]}" -np "$np" "$BIN/collective_perf" "${SWEEP[@]}" "$@" --out "$work/$name.h5" </dev/null >"$tmp/out" 2>&1
}
# suspects FILE: the "suspect ..." lines of a diagnosis, one per line, sorted
suspects() { grep -E '^suspect ' "$1" | sed -E 's/^suspect (node|link|link or node) ([^:]+(:[^ :]+)?):.*/\1 \2/' | sort; }

echo "--- 1. 4 nodes, node3 at $SLOW of $RATE Mbit/s [$((SECONDS - T0)) s]"
if up --nodes 4 --link-mbit $RATE --slow node3=$SLOW; then
  if sweep node3 4; then ok "sweep of 4 nodes: 6 pairs in 3 rounds"; else bad "sweep of 4 nodes"; fi
  "${DIAG[@]}" "$work/node3.h5" --json "$work/node3.json" --report-dir "$work/node3-report" >"$tmp/d1" 2>&1
  rc=$?
  cp "$tmp/d1" "$tmp/out"
  if [ $rc = 1 ] && [ "$(suspects "$tmp/d1")" = "node node3" ]; then ok "diagnosis names node3 and nothing else (exit 1)"
  else echo "      exit $rc; suspects: $(suspects "$tmp/d1" | tr '\n' ';')" >>"$tmp/out"; bad "diagnosis names node3 and nothing else"; fi
  check "... its evidence: node3's three pairs" grep -qE '^suspect node node3: .*node1:node3.*node2:node3.*node3:node4' "$tmp/d1"
  check "... the drain line is printed, not run" grep -q '(to drain, not run) scontrol update nodename=node3 state=drain' "$tmp/d1"
  check "... JSON and the HTML heat map" "$PY" -c "
import json, sys; d = json.load(open('$work/node3.json'))
assert d['exit'] == 1 and [s['name'] for s in d['suspects']] == ['node3'], d['suspects']
assert len(d['pairs']) == 6 * 2 and d['drain'][0].startswith('scontrol update nodename=node3')
h = open('$work/node3-report/report.html').read(); assert 'data:image/png;base64,' in h and 'node node3' in h"
  # the quick pass of a large allocation: 2 rounds, each node paired twice
  if sweep node3-quick 4 --rounds 2; then
    expect "--rounds 2: 4 pairs in 2 rounds, and the diagnosis still names node3 alone" 1 "^diagnose: 1 suspect\(s\): node node3 " -- \
      "${DIAG[@]}" "$work/node3-quick.h5"
  else bad "--rounds 2 sweep"; fi
  pairs=$(sed -nE 's/^next: .*--pairs ([^ ]+) .*/\1/p' "$tmp/d1")
  if [ -n "$pairs" ] && sweep node3-retest 4 --pairs "$pairs"; then
    expect "re-test against known-good nodes confirms node3" 1 "^suspect node node3: .*re-test: confirmed" -- \
      "${DIAG[@]}" "$work/node3.h5" --retest "$work/node3-retest.h5"
  else bad "re-test of the printed pairs ($pairs)"; fi
fi

echo "--- 2. 4 nodes, only the path node2-node4 at $SLOW Mbit/s [$((SECONDS - T0)) s]"
if up --nodes 4 --link-mbit $RATE --slow-path node2-node4=$SLOW; then
  sweep path 4 || bad "sweep with a slow path"
  "${DIAG[@]}" "$work/path.h5" >"$tmp/d2" 2>&1
  rc=$?
  cp "$tmp/d2" "$tmp/out"
  if [ $rc = 1 ] && [ "$(suspects "$tmp/d2")" = "link node2:node4" ]; then ok "diagnosis names the link node2:node4, no node (exit 1)"
  else echo "      exit $rc; suspects: $(suspects "$tmp/d2" | tr '\n' ';')" >>"$tmp/out"; bad "diagnosis names the link node2:node4, no node"; fi
  pairs=$(sed -nE 's/^next: .*--pairs ([^ ]+) .*/\1/p' "$tmp/d2")
  if [ -n "$pairs" ] && sweep path-retest 4 --pairs "$pairs"; then
    expect "re-test confirms the link, both its nodes fine with good nodes" 1 \
      "^suspect link node2:node4: .*re-test: confirmed\)" -- "${DIAG[@]}" "$work/path.h5" --retest "$work/path-retest.h5"
    check "... and names no node" bash -c "! grep -q '^suspect node' '$tmp/out'"
  else bad "re-test of the printed pairs ($pairs)"; fi
fi

echo "--- 3. 5 nodes (a bye each round), node2 at $SLOW Mbit/s [$((SECONDS - T0)) s]"
if up --nodes 5 --link-mbit $RATE --slow node2=$SLOW; then
  sweep bye 5 || bad "sweep of 5 nodes"
  cp "$tmp/out" "$tmp/bye"
  expect "5 nodes: 10 pairs in 5 rounds" 0 "10 pairs in 5 rounds" -- cat "$tmp/bye"
  "${DIAG[@]}" "$work/bye.h5" >"$tmp/d3" 2>&1
  rc=$?
  cp "$tmp/d3" "$tmp/out"
  if [ $rc = 1 ] && [ "$(suspects "$tmp/d3")" = "node node2" ]; then ok "5 nodes: names node2 and nothing else"
  else echo "      exit $rc; suspects: $(suspects "$tmp/d3" | tr '\n' ';')" >>"$tmp/out"; bad "5 nodes: names node2 and nothing else"; fi
fi

echo "--- 4. 4 nodes, nothing shaped: 5 sweeps in a row [$((SECONDS - T0)) s]"
if up --nodes 4 --link-mbit $RATE; then
  clean=0
  for i in 1 2 3 4 5; do
    sweep healthy$i 4 || { bad "healthy sweep $i"; continue; }
    "${DIAG[@]}" "$work/healthy$i.h5" >"$tmp/d4" 2>&1
    rc=$?
    if [ $rc = 0 ] && [ -z "$(suspects "$tmp/d4")" ]; then clean=$((clean + 1)); else
      echo "      sweep $i: exit $rc: $(tail -n 3 "$tmp/d4" | head -n 1)"; cp "$tmp/d4" "$tmp/out"; fi
  done
  if [ $clean = 5 ]; then ok "nothing shaped: healthy, no suspect, 5 sweeps of 5"; else bad "nothing shaped: healthy in $clean of 5 sweeps"; fi
  # a baseline of these sweeps: the next one is judged against each pair's own history too
  mkdir -p "$work/base" && cp "$work"/healthy[1-4].h5 "$work/base/"
  expect "against a baseline of 4 sweeps of the same nodes: healthy" 0 "^diagnose: healthy" -- \
    "${DIAG[@]}" "$work/healthy5.h5" --baseline "$work/base"
fi

echo "--- 5. the result file; rank-matched pairs and each node's all-reduce; the data check [$((SECONDS - T0)) s]"
if RPN=2 up --nodes 3 --link-mbit $RATE; then
  sweep matched 6 --pair-ranks matched -b 256K -e 1M -f 4 -n 4 -w 1 || bad "rank-matched sweep"
  check "3 nodes x 2 ranks: each pair once a size, 2 rank pairs, every iteration, each node's all-reduce" "$PY" -c "
import h5py, numpy as np
f = h5py.File('$work/matched.h5'); a = f.attrs; p = f['pairs'][()]; s = f['samples'][()]
assert a['pattern'] == b'pairs' or a['pattern'] == 'pairs'
assert int(a['nodes']) == 3 and int(a['rounds']) == 3 and int(a['ranks_per_pair']) == 2
ex = p[p['kind'] == 0]
assert sorted({(int(x), int(y)) for x, y in zip(ex['node_a'], ex['node_b'])}) == [(0, 1), (0, 2), (1, 2)]
assert sorted(set(ex['size'].tolist())) == [262144, 1048576] and len(ex) == 6 and (ex['rank_pairs'] == 2).all()
assert len(p[p['kind'] == 1]) == 3 and (p[p['kind'] == 1]['size'] == 8).all()
intra = p[p['kind'] == 2]; assert len(intra) == 3 * 2 and (intra['busbw'] > 0).all()
assert len(s[s['kind'] == 0]) == 6 * 4 * 2 * 2   # pairs x iterations x ranks a pair x ... 2 ranks each side
assert (s[s['kind'] != 2]['time'] > 0).all() and float(a['sweep_seconds']) > 0
names = [n.decode() if isinstance(n, bytes) else n for n in f['pairs'].attrs['node_names']]
assert names == ['node1', 'node2', 'node3'], names"
  expect "the data check catches one corrupted word: exit 4, status failed" 4 "Out of bounds values : [1-9][0-9]* FAILED" -- \
    "${MPI[@]}" -np 6 "$BIN/collective_perf" "${SWEEP[@]}" -n 2 -w 0 --inject-error 2 --out "$work/corrupt.h5"
  expect "... and diagnose refuses it in one line, exit 2" 2 "^diagnose: cannot diagnose: .*status failed" -- \
    "${DIAG[@]}" "$work/corrupt.h5"
  expect "--pairs naming a host not in the run: one line, exit 2" 2 "--pairs 'node1:node9': 'node9' is not a node of this run" -- \
    "${MPI[@]}" -np 3 "$BIN/collective_perf" "${SWEEP[@]}" --pairs node1:node9 --out "$work/bad1.h5"
  expect "--pattern pairs with --ops: one line, exit 2" 2 "--ops is not allowed with --pattern pairs" -- \
    "${MPI[@]}" -np 3 "$BIN/collective_perf" "${SWEEP[@]}" --ops all-gather --out "$work/bad2.h5"
  expect "--pair-ranks matched on nodes of 1 and 2 ranks: one line, exit 2" 2 "--pair-ranks matched needs the same number of ranks on every node" -- \
    "${MPI[@]}" -np 5 "$BIN/collective_perf" "${SWEEP[@]}" --pair-ranks matched --out "$work/bad3.h5"
  expect "--rounds beyond the schedule: one line, exit 2" 2 "--rounds 4 is not allowed: 3 nodes have 3 rounds of pairs" -- \
    "${MPI[@]}" -np 6 "$BIN/collective_perf" "${SWEEP[@]}" --rounds 4 --out "$work/bad4.h5"
  for b in bad1 bad2 bad3 bad4; do [ -e "$work/$b.h5" ] && bad "no result file for $b"; done
  ok "no result file for refused input"
fi
"$C" down >/dev/null 2>&1
expect "one node: --pattern pairs refused in one line, exit 2" 2 "--pattern pairs needs ranks on at least 2 nodes" -- \
  mpirun -np 2 "$BIN/collective_perf" "${SWEEP[@]}" --out "$work/one.h5"
[ -e "$work/one.h5" ] && bad "one node: no result file"
expect "diagnose: an ordinary collective_perf result is not a pair sweep" 2 "^diagnose: cannot diagnose: .*not a pair sweep" -- \
  "${DIAG[@]}" "$ROOT/tests/data/regress/run00.h5"
expect "diagnose: a baseline of fewer than 3 sweeps" 2 "needs at least 3" -- \
  "${DIAG[@]}" "$work/node3.h5" --baseline "$work/node3.h5"
echo "pair_sweep_tests: $((SECONDS - T0)) s"
summary
