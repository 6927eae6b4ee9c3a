#!/usr/bin/env bash
# The README's two commands on a machine where the packages appear only once `make deps`
# has run: the class of bug where Make builds with the probes it read before `deps`
# installed anything (hdf5.h not found on a fresh machine). Fast: the Makefile and mk/*.mk
# run for real over the tree's sources, with stand-ins for everything around them:
#   - PATH holds the shell tools Make needs and nothing of MPI, HDF5 or CUDA;
#   - pkg-config answers only once the stand-in deps has "installed" the packages;
#   - the stand-in deps puts an mpicxx on PATH that fails as the real compiler would
#     ("hdf5.h: No such file") unless the HDF5 flags pkg-config gives are on its line;
#   - the demo, the test suites and the Slurm tests are stand-ins that record they ran.
# tests/first_contact_test.sh [DIR]: DIR's Makefile and mk/ (default: this checkout's).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FROM=$(cd "${1:-$ROOT}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok    $1"; }
bad() { fail=$((fail + 1)); echo "FAIL  $1"; sed 's/^/      | /' "$2" | tail -n 8; }

# Shell tools only: linked one by one, so no mpicxx, h5cc, nvcc or pkg-config comes along.
mkdir -p "$tmp/tools"
for t in bash sh make env nproc mkdir rm cmp mv cat cp ln touch chmod uname sed grep tail head \
         dirname basename ls tr wc sort id date printf true false test sleep; do
  p=$(command -v "$t") && ln -s "$p" "$tmp/tools/$t"
done

# A fresh machine: the tree's sources and build files, no packages, nothing installed.
fresh() {
  local m=$tmp/m$1
  mkdir -p "$m/tree/tests" "$m/tree/scripts" "$m/tree/slurm/test" "$m/bin" "$m/state"
  cp "$FROM/Makefile" "$m/tree/" && cp -r "$FROM/mk" "$m/tree/"
  cp -r "$ROOT/src" "$ROOT/include" "$m/tree/"
  cp "$ROOT"/tests/*.cpp "$ROOT"/tests/*.h "$m/tree/tests/"
  cp -r "$ROOT/tests/gpu" "$m/tree/tests/"
  local S=$m/state
  cat >"$m/bin/pkg-config" <<EOF
#!/bin/bash
[ -e $S/installed ] || exit 1
case "\$*" in
  *--cflags*hdf5-openmpi*) echo "-I$m/hdf5/include" ;;
  *--libs*hdf5-openmpi*) echo "-L$m/hdf5/lib -lhdf5" ;;
esac
exit 0
EOF
  cat >"$m/mpicxx" <<EOF
#!/bin/bash
echo "\$*" >>$S/compile.log
case " \$* " in *" -I$m/hdf5/include "*) ;; *) echo "fatal error: hdf5.h: No such file or directory" >&2; exit 1 ;; esac
out=; prev=; for a in "\$@"; do [ "\$prev" = -o ] && out=\$a; prev=\$a; done
[ -z "\$out" ] || touch "\$out"
EOF
  printf '#!/bin/bash\nshift; touch "$1"\n' >"$m/bin/ar"
  cat >"$m/tree/scripts/install-deps.sh" <<EOF
[ -e $S/installed ] && { echo "deps: all present"; exit 0; }
echo install >>$S/installs
cp $m/mpicxx $m/bin/mpicxx && touch $S/installed
EOF
  echo "echo demo >>$S/ran" >"$m/tree/scripts/demo.sh"
  echo "echo tests >>$S/ran" >"$m/tree/tests/run_tests.sh"
  echo "open('$S/ran', 'a').write('sweep\n')" >"$m/tree/tests/test_sweep.py"
  echo "echo slurm >>$S/ran" >"$m/tree/slurm/test/slurm-test.sh"
  echo "echo slurm-multinode >>$S/ran" >"$m/tree/slurm/test/slurm-multinode-test.sh"
  echo "echo install >>$S/ran" >"$m/tree/tests/install_test.sh"
  chmod +x "$m/bin/"* "$m/mpicxx"
  echo "$m"
}
# on MACHINE ARGS...: make ARGS in the machine's tree, as a user would, output in $m/out.
on() {
  local m=$1; shift
  (cd "$m/tree" && env -i HOME="$m" PATH="$m/bin:$tmp/tools" CUDA_HOME="$m/no-cuda" \
     make "$@") >"$m/out" 2>&1
}
count() { grep -c "^$2\$" "$1" 2>/dev/null || echo 0; }

# `make demo` first, then `make test`: deps installs once, both build with what it put in.
m=$(fresh 1)
on "$m" demo; rc=$?
if [ $rc = 0 ] && [ "$(count $m/state/installs install)" = 1 ] && [ "$(count $m/state/ran demo)" = 1 ] \
   && [ -s "$m/state/compile.log" ]; then ok "make demo first: installs, then builds with what deps installed"
else echo "exit $rc" >>"$m/out"; bad "make demo first: installs, then builds with what deps installed" "$m/out"; fi
on "$m" test; rc=$?
if [ $rc = 0 ] && [ "$(count $m/state/installs install)" = 1 ] && [ "$(count $m/state/ran tests)" = 1 ] \
   && [ "$(count $m/state/ran slurm)" = 1 ] && [ "$(count $m/state/ran slurm-multinode)" = 1 ] \
   && [ "$(count $m/state/ran install)" = 1 ] && grep -q "deps: all present" "$m/out"; then
  ok "make test second: installs nothing, runs every suite"
else echo "exit $rc" >>"$m/out"; bad "make test second: installs nothing, runs every suite" "$m/out"; fi

# `make -j2 test` first (as .ci/run calls it), then `make demo`.
m=$(fresh 2)
on "$m" -j2 test; rc=$?
if [ $rc = 0 ] && [ "$(count $m/state/installs install)" = 1 ] && [ "$(count $m/state/ran tests)" = 1 ] \
   && [ "$(count $m/state/ran sweep)" = 1 ]; then ok "make -j2 test first: installs, builds, runs every suite"
else echo "exit $rc" >>"$m/out"; bad "make -j2 test first: installs, builds, runs every suite" "$m/out"; fi
on "$m" demo; rc=$?
if [ $rc = 0 ] && [ "$(count $m/state/installs install)" = 1 ] && [ "$(count $m/state/ran demo)" = 1 ]; then
  ok "make demo second: installs nothing, runs the demo"
else echo "exit $rc" >>"$m/out"; bad "make demo second: installs nothing, runs the demo" "$m/out"; fi

# `make` alone: one line saying what to run, no compile attempted.
m=$(fresh 3)
on "$m"; rc=$?
if [ $rc != 0 ] && [ "$(wc -l <"$m/out")" = 1 ] && grep -q "make deps" "$m/out" && [ ! -e "$m/state/compile.log" ]; then
  ok "make alone on a fresh machine: one line naming 'make deps', exit $rc"
else echo "exit $rc" >>"$m/out"; bad "make alone on a fresh machine: one line naming 'make deps'" "$m/out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
