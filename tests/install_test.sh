#!/usr/bin/env bash
# make install into a temporary prefix, then work from the installed tree alone (the build
# directory hidden): the modulefile, a slurm/sweep dry run that finds the installed
# programs, a 2-rank collective_perf and ddp_perf run, the analysis; then make uninstall
# leaves nothing behind. Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
P=$tmp/prefix
expect "make install PREFIX=<temporary>" 0 "installed shardbench .* in $P" -- make -C "$ROOT" --no-print-directory install PREFIX="$P"
for f in bin/ddp_perf bin/fsdp_perf bin/collective_perf bin/kernel_bench share/shardbench/slurm/sweep \
  share/shardbench/analysis/summarize.py share/shardbench/runs/local.toml share/shardbench/scripts/mpi-env.sh \
  share/shardbench/LICENSE; do
  check "installed: $f" test -e "$P/$f"
done
check "the sweep generator stays executable" test -x "$P/share/shardbench/slurm/sweep"
cuda_plugin=$(test -e "$ROOT/build/lib/libshardbench_cuda.so" && echo yes)
[ -n "$cuda_plugin" ] && check "installed: lib/libshardbench_cuda.so (this build has the CUDA backend)" \
  test -e "$P/lib/libshardbench_cuda.so"
mod=$(ls "$P"/share/modulefiles/shardbench/* 2>/dev/null | head -1)
expect "modulefile: PATH and SHARDBENCH_HOME with the prefix" 0 "prepend-path PATH +$P/bin" -- cat "$mod"
check "modulefile names SHARDBENCH_HOME" grep -q "setenv *SHARDBENCH_HOME *$P/share/shardbench" "$mod"

# From here on the build directory is out of reach.
hidden=$ROOT/build.hidden-install-test-$$
mv "$ROOT/build" "$hidden" || { echo "cannot hide $ROOT/build"; exit 1; }
trap 'mv "$hidden" "$ROOT/build"; rm -rf "$tmp"' EXIT
export PATH=$P/bin:$PATH
cd "$tmp/work"
expect "sweep dry run from the installed tree finds the installed programs" 0 "dry run: .* jobs" -- \
  "$P/share/shardbench/slurm/sweep" "$P/share/shardbench/runs/local.toml" --dry-run
cp "$tmp/out" "$tmp/dry"
check "... the job scripts run $P/bin" grep -q "$P/bin/ddp_perf" "$tmp/dry"
check "... and put results under the current directory" grep -q "results: *$tmp/work/results/local" "$tmp/dry"
expect "2-rank collective_perf from the installed tree" 0 'Out of bounds values : 0 OK' -- \
  mpirun -np 2 --bind-to none collective_perf -b 1K -e 64K -f 8 -n 3 -w 1 --out "$tmp/work/c.h5"
expect "2-rank ddp_perf from the installed tree" 0 'wrote .*ddp.h5' -- \
  mpirun -np 2 --bind-to none ddp_perf --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1 \
  --out "$tmp/work/ddp.h5"
expect "installed analysis reads the result" 0 'ddp +t5-tiny +2' -- $PY "$P/share/shardbench/analysis/summarize.py" "$tmp/work/ddp.h5"
# --backend cuda loads the installed plugin (PREFIX/lib): past the loader, the GPU is what is
# missing here (or the run passes, on a GPU host)
if [ -n "$cuda_plugin" ]; then
  fsdp_perf --backend cuda --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 1 --warmup 0 \
    --out "$tmp/work/cuda.h5" >"$tmp/out" 2>&1
  if grep -qE 'no CUDA device visible|wrote .*cuda.h5' "$tmp/out" && ! grep -q 'cannot load' "$tmp/out"; then
    ok "--backend cuda from the installed tree loads PREFIX/lib/libshardbench_cuda.so"
  else bad "--backend cuda from the installed tree loads PREFIX/lib/libshardbench_cuda.so"; fi
fi
mv "$hidden" "$ROOT/build"
trap 'rm -rf "$tmp"' EXIT

expect "make uninstall" 0 "removed shardbench from $P" -- make -C "$ROOT" --no-print-directory uninstall PREFIX="$P"
if [ -z "$(find "$P" -mindepth 1 2>/dev/null)" ]; then ok "uninstall leaves nothing"; else find "$P" >"$tmp/out"; bad "uninstall leaves nothing"; fi
expect "a relative PREFIX is refused" 2 "PREFIX 'opt' is not allowed" -- make -C "$ROOT" --no-print-directory install PREFIX=opt
summary
