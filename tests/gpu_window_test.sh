#!/usr/bin/env bash
# scripts/gpu-window.sh and scripts/gpu-check.sh --stale, without a GPU: a bundle whose
# gpu-check.sh is a stand-in (each part writes a log, an HDF5 file and a verdict, and takes
# PART_S seconds) shows which parts the window starts, that it stops one at the deadline,
# and that results and ledger rows reach the output folder whatever happens; --stale is
# read against ledgers written here.
source "$(dirname "$0")/lib.sh"
W=$ROOT/scripts/gpu-window.sh

# A bundle: an empty runtime (extracted into a scratch root) and a project whose gpu-check
# stands in for the real one.
mkbundle() {
  local b=$1 p=$tmp/proj/sb
  rm -rf "$tmp/proj" && mkdir -p "$b" "$p/scripts" "$p/build/gen" "$tmp/rt/usr/lib"
  echo '#define SB_VERSION "abc1234"' >"$p/build/gen/version.h"
  cat >"$p/scripts/gpu-check.sh" <<'EOF'
part=$1; d=results/gpu-check/$part; mkdir -p "$d"
echo "ran $part" >"$d/$part.log"; echo h5 >"$d/$part.h5"
sleep "${PART_S:-0}"
echo "$part: PASS: stand-in figures for $part [0 s]" >"results/gpu-check/$part.verdict"
EOF
  touch "$tmp/rt/usr/lib/libstandin.so"
  tar -cJf "$b/runtime.tar.xz" -C "$tmp/rt" usr
  tar -cJf "$b/project.tar.xz" -C "$tmp/proj" sb
}
mkbundle $tmp/b
mkdir -p $tmp/root
export SB_RUNTIME_ROOT=$tmp/root SB_WINDOW_WORK=$tmp/work

printf 'tests\nperf\n' >$tmp/b/parts
expect "the parts listed in the bundle run in order; results and ledger rows reach OUT" 0 'parts: tests perf' -- \
  bash $W $tmp/b $tmp/out1
check "  logs, HDF5 and verdicts copied" test -s $tmp/out1/gpu-check/perf/perf.h5 -a -s $tmp/out1/gpu-check/tests/tests.log
check "  the runtime unpacked into its root" test -e $tmp/root/usr/lib/libstandin.so
expect "  one ledger row per part, with the bundle's commit" 0 '^\| `perf` \| abc1234 \| [0-9-]+ \| .* \| PASS: stand-in figures for perf \[0 s\] \|$' -- \
  cat $tmp/out1/ledger-rows.md

expect "a part that does not fit the time left is not started (the first always is)" 0 'not started: mpi \(about 100 s' -- \
  env SB_WINDOW_ESTIMATES="tests=1 perf=1 mpi=100" WINDOW_S=60 bash $W $tmp/b $tmp/out2 tests perf mpi
if [ -e $tmp/out2/gpu-check/mpi ]; then bad "  mpi did not run"; else ok "  mpi did not run"; fi

expect "a part still running at the window's end is stopped; what it wrote is kept" 1 'part perf: stopped at the window' -- \
  env PART_S=30 WINDOW_S=3 bash $W $tmp/b $tmp/out3 perf
check "  its log reached OUT" test -s $tmp/out3/gpu-check/perf/perf.log

rm $tmp/b/project.tar.xz
expect "a bundle without its project: one line, exit 2" 2 'project.tar.xz is missing' -- bash $W $tmp/b $tmp/out4

# --stale against ledgers: a row at HEAD is current, an old row or none is stale.
head=$(git -C $ROOT rev-parse --short HEAD)
first=$(git -C $ROOT rev-list --max-parents=0 HEAD | head -n 1 | cut -c1-7)
cat >$tmp/ledger.md <<EOF
## The GPU ledger
| part | commit | date | GPU | verdict | key figures |
|---|---|---|---|---|---|
| \`tests\` | $head | 2026-11-26 | H200 | PASS | x |
| \`perf\` | $first | 2026-11-01 | H100 | PASS | x |
| \`attention\` | never | | | | |
## Next section
| \`mpi\` | $head | 2026-11-26 | H200 | PASS | not in the ledger's section |
EOF
SB_LEDGER=$tmp/ledger.md bash $ROOT/scripts/gpu-check.sh --stale >$tmp/stale.txt 2>&1
cp $tmp/stale.txt $tmp/out
check "--stale: a part that ran at HEAD is current" grep -q "^tests  *current: ran at $head" $tmp/stale.txt
check "--stale: a part whose code changed since is stale, with what changed" grep -qE "^perf  *stale: ran at $first .* commit\(s\) since touch .*src/backend" $tmp/stale.txt
check "--stale: never ran, or no row in the ledger's section, is stale" grep -q "^mpi  *stale: never ran" $tmp/stale.txt
expect "--stale --names: the stale parts' names, in window order" 0 '^perf,mpi,correctness,sanitize,attention,hf$' -- \
  bash -c "SB_LEDGER=$tmp/ledger.md bash $ROOT/scripts/gpu-check.sh --stale --names | paste -sd, -"
summary
