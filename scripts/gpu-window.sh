#!/usr/bin/env bash
# One short GPU window, one command: on a GPU host that has the CUDA driver and NCCL but no
# MPI, HDF5 or package access, unpack a bundle built and packed elsewhere, run the next
# parts of scripts/gpu-check.sh within a time limit, and copy what they wrote (logs, HDF5,
# verdicts) to an output folder whatever happens, with ledger rows ready for docs/gpu.md.
#
#   scripts/gpu-window.sh BUNDLE OUT [PART...]
#
# BUNDLE holds runtime.tar.xz (Open MPI, parallel HDF5, OpenBLAS, ... extracted into / without
# replacing a file, then ldconfig) and project.tar.xz (the built tree). PARTS: the arguments,
# else BUNDLE/parts (one per line: written before packing by `scripts/gpu-check.sh --stale
# --names > BUNDLE/parts`, since the host has no git history), else every part in order.
# Environment: WINDOW_S (540: the whole window, unpacking included; keep it under the
# command's own time limit so that the copy runs), SB_WINDOW_WORK (/tmp/sb-window),
# SB_RUNTIME_ROOT (/), SB_WINDOW_ESTIMATES ("tests=120 perf=360 ..." overrides the
# seconds each part is expected to take: a part is started only when that much is left,
# except the first, which always starts; a part still running at the deadline is stopped).
# Exit: 0 when every part started passed, 1 otherwise, 2 for a bad bundle.
set -uo pipefail
bundle=$(cd "${1:?usage: gpu-window.sh BUNDLE OUT [PART...]}" && pwd) || exit 2
mkdir -p "${2:?usage: gpu-window.sh BUNDLE OUT [PART...]}" && out=$(cd "$2" && pwd) || exit 2
shift 2
start=$(date +%s)
deadline=$((start + ${WINDOW_S:-540}))
work=${SB_WINDOW_WORK:-/tmp/sb-window}
log=$out/window.log
say() { echo "gpu-window: $*" | tee -a "$log"; }
declare -A estimate=([tests]=120 [perf]=360 [mpi]=480 [correctness]=300 [sanitize]=480 [attention]=120 [hf]=480)
for kv in ${SB_WINDOW_ESTIMATES:-}; do estimate[${kv%%=*}]=${kv#*=}; done

tree=
# Whatever happens (a failed part, the deadline, a signal): the results leave with OUT.
finish() {
  local rc=$?
  if [ -n "$tree" ] && [ -d "$tree/results/gpu-check" ]; then
    cp -r "$tree/results/gpu-check" "$out/" 2>/dev/null
    # One ledger row per part that reached a verdict (docs/gpu.md, "The GPU ledger").
    local v part verdict gpu commit
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    commit=$(sed -n 's/^#define SB_VERSION "\(.*\)"/\1/p' "$tree/build/gen/version.h" 2>/dev/null)
    : >"$out/ledger-rows.md"
    for v in "$tree"/results/gpu-check/*.verdict; do
      [ -e "$v" ] || continue
      part=$(basename "$v" .verdict)
      verdict=$(cut -d: -f2- "$v" | sed 's/^ //')
      printf '| `%s` | %s | %s | %s | %s |\n' "$part" "${commit:-unknown}" "$(date -u +%F)" "${gpu:-unknown GPU}" \
        "${verdict//|//}" >>"$out/ledger-rows.md"
    done
  fi
  say "done in $(($(date +%s) - start)) s (exit $rc); results in $out"
  exit "$rc"
}
trap finish EXIT
trap 'say "stopped by a signal"; exit 1' TERM INT

for f in runtime.tar.xz project.tar.xz; do
  [ -s "$bundle/$f" ] || { say "error: $bundle/$f is missing (pack the built tree first)"; exit 2; }
done
root=${SB_RUNTIME_ROOT:-/}
tar -xJf "$bundle/runtime.tar.xz" -C "$root" --skip-old-files 2>>"$log" || { say "error: unpacking the runtime failed"; exit 2; }
[ "$root" = / ] && ldconfig 2>/dev/null
rm -rf "$work" && mkdir -p "$work"
tar -xJf "$bundle/project.tar.xz" -C "$work" || { say "error: unpacking the project failed"; exit 2; }
tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)
[ -f "$tree/scripts/gpu-check.sh" ] || { say "error: no scripts/gpu-check.sh in the bundle's project"; exit 2; }
say "unpacked in $(($(date +%s) - start)) s: $tree ($(sed -n 's/^#define SB_VERSION //p' "$tree/build/gen/version.h" 2>/dev/null))"

# NCCL: the host's own (PyTorch's wheel) when the toolkit has none. The CUDA plugin links it
# (the programs load the plugin at --backend cuda), and so does test_cuda_backend.
plugin=$tree/build/lib/libshardbench_cuda.so
if [ -e "$plugin" ] && ldd "$plugin" 2>/dev/null | grep -q "libnccl.so.2 => not found"; then
  nccl=$(find / -xdev -name libnccl.so.2 -path '*nvidia*' 2>/dev/null | head -n 1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH=$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "NCCL: ${nccl:-not found}"
fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${CUDA_HOME:-/usr/local/cuda}/lib64

parts=("$@")
[ ${#parts[@]} -gt 0 ] || { [ -s "$bundle/parts" ] && mapfile -t parts < <(grep -v '^ *$' "$bundle/parts"); }
[ ${#parts[@]} -gt 0 ] || parts=(tests perf mpi correctness sanitize attention hf)
say "parts: ${parts[*]}; window ${WINDOW_S:-540} s"
failed=0 first=1
for p in "${parts[@]}"; do
  left=$((deadline - $(date +%s)))
  need=${estimate[$p]:-300}
  if [ "$first" = 0 ] && [ "$left" -lt "$need" ]; then
    say "not started: $p (about $need s, $left s left)"
    continue
  fi
  [ "$left" -gt 0 ] || { say "not started: $p (the window is over)"; continue; }
  first=0
  say "part $p: up to $left s"
  (cd "$tree" && SKIP_BUILD=1 timeout -k 10 "$left" bash scripts/gpu-check.sh "$p") 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && say "part $p: stopped at the window's end"
  [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
