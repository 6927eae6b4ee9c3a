#!/usr/bin/env bash
# gpu-check: the CUDA backend on a machine WITH a GPU, in parts that a GPU lent for minutes
# can run one at a time. Each part ends with one verdict line; every part's outputs go to
# results/gpu-check/<part>/, the verdicts to results/gpu-check/summary.txt, and the whole
# of results/gpu-check/ to results/gpu-check.tar.gz after every invocation.
#
#   scripts/gpu-check.sh [PART...]     the parts in the order given (none: all of them)
#   scripts/gpu-check.sh --help        the parts, what each runs, about how long (no GPU needed)
#   scripts/gpu-check.sh --stale [--names]   the parts whose last run in the GPU ledger
#                                      (docs/gpu.md) is older than the last change to the code
#                                      they cover (no GPU needed; --names: names only)
#   make gpu-check                     all parts
#
# Exit 0 when every part run passed, 1 otherwise, 2 for an unknown part.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RESULTS=$ROOT/results
OUT=$RESULTS/gpu-check
BIN=${SB_BIN:-$ROOT/build/bin}
# In the order a short GPU window should run them: the tests, then the defaults decision.
PARTS=(tests perf mpi correctness sanitize attention hf)
# What each part covers: a commit touching any of these paths after the part's ledger row
# makes the part stale (--stale).
BACKEND_PATHS="src/backend include/shardbench/backend src/core include/shardbench/core mk/cuda.mk"
MODEL_PATHS="src/model include/shardbench/model"
STEP_PATHS="src/strategy include/shardbench/strategy src/train include/shardbench/train src/trace include/shardbench/trace src/run include/shardbench/run"
declare -A COVERS=(
  [tests]="$BACKEND_PATHS $MODEL_PATHS tests/gpu"
  [perf]="$BACKEND_PATHS $MODEL_PATHS $STEP_PATHS"
  [mpi]="$BACKEND_PATHS $MODEL_PATHS $STEP_PATHS"
  [correctness]="$BACKEND_PATHS $MODEL_PATHS $STEP_PATHS"
  [sanitize]="$BACKEND_PATHS $MODEL_PATHS $STEP_PATHS tests/gpu"
  [attention]="src/backend/cuda src/programs/kernel_bench.cpp src/programs/attention_bench.h"
  [hf]="$BACKEND_PATHS $MODEL_PATHS $STEP_PATHS analysis/hf_t5_step.py analysis/torch_t5_step.py scripts/hf-compare.sh"
)
LEDGER=${SB_LEDGER:-$ROOT/docs/gpu.md}

usage() {
  cat <<'EOF'
usage: scripts/gpu-check.sh [PART...]      (no PART: all, in this order)
       scripts/gpu-check.sh --stale [--names]  (no GPU needed: the parts whose last run in
                                       the GPU ledger, docs/gpu.md, predates a change to
                                       the code they cover; --names: their names only)

Parts (times: estimates for one H100 80GB, each part within 10 minutes; a build first,
make -j, unless SKIP_BUILD=1, adds 2-5 minutes to the first part of a fresh checkout):
  tests        build/bin/test_cuda_backend (every GPU test, a skip counts as a failure:
               the kernels against the CPU and the double-precision reference, tensor-core
               attention against its SIMT emulation, the opt-in paths, collectives) and
               build/bin/gemm_peak (cuBLAS bf16/tf32/fp32 peaks).                ~2 min
  perf         fsdp_perf --backend cuda, one rank, bf16, batch 8, seq 512: t5-611m,
               t5-2.28b, t5-11.3b LAYERS (4)+LAYERS layers; unfused (the default) against
               each opt-in path (--attention fused, --fused-epilogues, --cuda-graphs, all
               three): step ms, TFLOPS, MFU of the measured bf16 peak; which opt-in is
               faster at all three shapes (the rule for CUDA defaults, docs/gpu.md). ~6 min
  mpi          --comm mpi on 2 and 4 ranks sharing the GPU(s): DDP, FSDP full, hybrid 2,
               grad-op, none, optimizer-state (ZeRO-1), CPU offload (params; optimizer
               under ZeRO-1), and the layouts (--tp 2 under DDP and FSDP full, --pp 2
               1F1B under FSDP full and GPipe under DDP; on 4 ranks also --pp 2 x --tp 2)
               x fp32, bf16 (--check): the way to run TP and PP on one GPU; compute-
               sanitizer memcheck of five 2-rank runs (one --tp 2, one --pp 2);
               collective_perf NCCL and MPI rows in one table.                  ~8 min
  correctness  --check on one GPU: DDP/FSDP in fp32, bf16, fp16; fused attention (tensor
               cores and FMA), --fused-epilogues, --cuda-graphs and all three together;
               NCCL across GPUs when there are several (with 2+ GPUs also --tp 2 and
               --pp 2 with both schedules; with 4+, --pp 2 x --tp 2 and --pp 2 x dp 2;
               on one GPU the mpi part runs them); fp32 --check CHECK_REPEAT (20)
               times in a row; an out-of-memory run must fail with one clear line. ~5 min
  sanitize     compute-sanitizer on the GPU tests (filtered lists) and a t5-tiny run with
               every opt-in path: memcheck (--report-api-errors no: NCCL's own probe of
               kernel images is an API error it handles), racecheck, synccheck, initcheck;
               errors in kernels that cuBLAS or NCCL launched are counted apart (the
               launch's first host frame below the driver is in libcublas* or libnccl*);
               the verdict is on shardbench's own.                 ~8 min (SANITIZE_TIMEOUT)
  attention    kernel_bench --backend cuda: one attention forward + backward per path
               (unfused, fused, fused-fma, fused-mma) at the three study models' head
               shapes, bf16 and fp32, ms and TFLOPS; against the targets 0.47 / 0.88 /
               5.10 ms (bf16).                                                   ~2 min
  hf           scripts/hf-compare.sh: ours against Hugging Face T5 eager and under
               torch.compile (HF_MODELS, default "t5-611m t5-11.3b"; t5-2.28b's compile
               took over 240 s: run HF_MODELS=t5-2.28b as a part of its own), no
               activation checkpointing (HF_CKPT="no yes" for both), HF_TIMEOUT (200 s)
               per Hugging Face run; target ours / compiled <= 0.85.            ~8 min

Environment: SKIP_BUILD=1, STEPS (5), WARMUP (2), LAYERS (4), CHECK_REPEAT (20),
SANITIZE_TIMEOUT (80 s per sanitizer run), MPI_COMMS ("mpi"; "mpi mpi-staged" on a
CUDA-aware MPI), PYTHON (python3), GPU_CHECK_HEADROOM (0.90 of GPU memory for plans).
Outputs: results/gpu-check/<part>/*.log, .h5; results/gpu-check/summary.txt (one verdict
line per part); results/gpu-check.tar.gz (all of it).
EOF
}

# --stale: each part against its ledger row (docs/gpu.md, "The GPU ledger"): stale when it
# never ran, when its commit is not in this clone, or when a later commit touched what it covers.
stale() {
  local names=$1 p row commit date n changed
  git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null ||
    { echo "gpu-check: error: --stale needs the git history of a checkout" >&2; exit 2; }
  [ -r "$LEDGER" ] || { echo "gpu-check: error: no ledger at $LEDGER" >&2; exit 2; }
  for p in "${PARTS[@]}"; do
    row=$(awk -v p="$p" -F'|' '/^## The GPU ledger/ { on = 1; next } /^## / { on = 0 }
      on && $2 ~ "^ *`" p "` *$" { gsub(/ /, "", $3); gsub(/^ +| +$/, "", $4); print $3 "|" $4; exit }' "$LEDGER")
    commit=${row%%|*} date=${row#*|}
    if [ -z "$row" ] || [ "$commit" = never ] || [ -z "$commit" ]; then
      [ "$names" = 1 ] && echo "$p" || printf '%-12s stale: never ran on a GPU\n' "$p"
    elif ! git -C "$ROOT" rev-parse --verify -q "$commit^{commit}" >/dev/null; then
      [ "$names" = 1 ] && echo "$p" || printf '%-12s stale: its commit %s is not in this clone\n' "$p" "$commit"
    else
      # shellcheck disable=SC2086  # the covered paths are words
      n=$(git -C "$ROOT" rev-list --count "$commit..HEAD" -- ${COVERS[$p]})
      if [ "$n" -eq 0 ]; then
        [ "$names" = 1 ] || printf '%-12s current: ran at %s (%s); nothing it covers changed since\n' "$p" "$commit" "$date"
      else
        # shellcheck disable=SC2086
        changed=$(git -C "$ROOT" diff --name-only "$commit" HEAD -- ${COVERS[$p]} | cut -d/ -f1-2 | sort -u | head -n 6 | paste -sd, -)
        [ "$names" = 1 ] && echo "$p" ||
          printf '%-12s stale: ran at %s (%s); %s commit(s) since touch %s\n' "$p" "$commit" "$date" "$n" "$changed"
      fi
    fi
  done
  exit 0
}
for a in "$@"; do
  case $a in
    -h | --help) usage; exit 0 ;;
    --stale) [ "$*" = "--stale --names" ] && stale 1; stale 0 ;;
  esac
done
selected=("$@")
[ ${#selected[@]} -gt 0 ] || selected=("${PARTS[@]}")
for p in "${selected[@]}"; do
  [[ " ${PARTS[*]} " == *" $p "* ]] || { echo "gpu-check: error: unknown part '$p' (allowed: ${PARTS[*]})" >&2; exit 2; }
done

PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
LAYERS=${LAYERS:-4}
HEADROOM=${GPU_CHECK_HEADROOM:-0.90}
say() { echo "gpu-check: $*"; }
die() { echo "gpu-check: error: $*" >&2; exit 1; }
# field NAME FILE PREFIX: value of NAME=... on the last line of FILE starting with PREFIX
field() { grep -E "^$3" "$2" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# ---------------------------------------------------------------- prerequisites, build
command -v nvidia-smi >/dev/null ||
  die "no GPU visible: nvidia-smi not found (no NVIDIA driver on this host). Run scripts/gpu-check.sh on a GPU node."
nvidia-smi -L >/dev/null 2>&1 || die "no GPU visible: nvidia-smi -L failed: $(nvidia-smi -L 2>&1 | head -n 1)"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
[ "$NGPU" -ge 1 ] || die "no GPU visible: nvidia-smi lists no GPU (check CUDA_VISIBLE_DEVICES)"
missing=()
command -v mpirun >/dev/null || missing+=("mpirun (Open MPI: bash scripts/install-deps.sh)")
command -v make >/dev/null || missing+=("make")
[ -n "${SKIP_BUILD:-}" ] || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || command -v nvcc >/dev/null ||
  missing+=("nvcc (the CUDA toolkit; set CUDA_HOME)")
[ ${#missing[@]} -eq 0 ] || die "missing: ${missing[*]}"
source scripts/mpi-env.sh
MPIRUN=(mpirun --bind-to none)
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 | tr -d ' ')
LIMIT_GIB=$(awk -v m="$GPU_MIB" -v h="$HEADROOM" 'BEGIN { printf "%.1f", m / 1024 * h }')
say "$NGPU GPU(s), GPU 0: $GPU_NAME, $GPU_MIB MiB; plans may use $LIMIT_GIB GiB; parts: ${selected[*]}"
if [ -z "${SKIP_BUILD:-}" ]; then
  say "building (log: $OUT/build.log)"
  make -j"$(nproc)" > "$OUT/build.log" 2>&1 || die "build failed: see $OUT/build.log"
  grep -i "warning" "$OUT/build.log" | head -n 5 | sed 's/^/gpu-check: build warning: /'
fi
for b in test_cuda_backend gemm_peak ddp_perf fsdp_perf collective_perf kernel_bench; do
  [ -x "$BIN/$b" ] || die "$BIN/$b was not built: the CUDA parts need nvcc, cuBLAS and NCCL (make probe)"
done
SANITIZER=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
[ -x "$SANITIZER" ] || SANITIZER=$(command -v compute-sanitizer || true)

# The part being run: its folder, its failures, its verdict.
P= D= part_failed=()
begin() {
  P=$1 D=$OUT/$1 part_failed=() part_start=$(date +%s)
  mkdir -p "$D"
  say "== part $P (logs: $D)"
}
fail() { part_failed+=("$1"); say "FAILED: $1"; }
# verdict TEXT: the part's one line, PASS unless something failed.
verdict() {
  local secs=$(($(date +%s) - part_start)) line
  if [ ${#part_failed[@]} -eq 0 ]; then line="$P: PASS: $1 [${secs} s]"
  else line="$P: FAIL: ${#part_failed[@]} failed (first: ${part_failed[0]}); $1 [${secs} s]"; fi
  echo "$line" > "$OUT/$P.verdict"
  echo "gpu-check: $line"
  [ ${#part_failed[@]} -eq 0 ] || any_failed=1
}
any_failed=0

# check_run NAME NP PROGRAM ARGS...: --check must PASS
check_run() {
  local name=$1 np=$2 prog=$3
  shift 3
  if "${MPIRUN[@]}" -np "$np" "$BIN/$prog" "$@" --out "$D/$name.h5" --overwrite > "$D/$name.log" 2>&1 &&
    grep -q -- "-> PASS" "$D/$name.log"; then
    say "ok $name"
    checks=$((checks + 1))
  else
    fail "$name (see $D/$name.log)"
  fi
}

# sanitizer_errors LOG: "ours library" error counts of a compute-sanitizer log. A report is
# the library's when the first host frame below the driver (libcuda) of its backtrace is in
# cuBLAS, cuBLASLt or NCCL: a kernel or API call those libraries made, not shardbench. Ours
# is the tool's own total (ERROR SUMMARY, or racecheck's errors) less the library's, so a
# report the log does not print (beyond --print-limit) counts as ours.
sanitizer_errors() {
  awk '
    function close_block() { if (open) { if (first ~ /libcublas|libnccl/) lib++; else parsed++ } open = 0; first = "" }
    /^========= ERROR SUMMARY: [0-9]+ errors?$/ { close_block(); total += $4; summary = 1; next }
    /^========= RACECHECK SUMMARY/ { close_block(); e = $0; sub(/.*\(/, "", e); total += e + 0; summary = 1; next }
    /^=========$/ { close_block(); next }
    /^========= (COMPUTE-SANITIZER|Target application|ERROR SUMMARY|LEAK SUMMARY)/ { close_block(); next }
    /^========= [^ ]/ { close_block(); open = 1; next }
    /^=========  +Host Frame:/ { if (open && first == "" && $0 !~ /libcuda\.so/) first = $0; next }
    END { close_block(); ours = summary ? total - lib : parsed; if (ours < 0) ours = 0; printf "%d %d\n", ours, lib }' "$1"
}
# sanitize_run NAME TOOL ARGS... -- PROGRAM ARGS...: the program under the tool on one rank,
# within SANITIZE_TIMEOUT; passes when it finished, the program passed, and no error is
# shardbench's own.
sanitize_run() {
  local name=$1 tool=$2 args=() rc
  shift 2
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  if [ -z "$SANITIZER" ]; then fail "$name: compute-sanitizer not found (CUDA toolkit)"; return; fi
  timeout "${SANITIZE_TIMEOUT:-80}" "${MPIRUN[@]}" -np 1 "$SANITIZER" --tool "$tool" --print-limit 10000 "${args[@]}" "$@" \
    > "$D/$name.log" 2>&1
  rc=$?
  read -r ours lib <<< "$(sanitizer_errors "$D/$name.log")"
  sanitized+=("$name: ${ours} ours, ${lib} cuBLAS/NCCL")
  # Where the reports point: the kernels named most often (a log cut at the timeout included).
  [ "$ours" -eq 0 ] && [ "$lib" -eq 0 ] ||
    awk '/^========= [^ ]/ { if (open) print what " <- " first; open = 1; what = $0; first = ""; next }
         /^=========     at / { what = $0; sub(/^=========     at /, "", what); sub(/\(.*/, "", what); next }
         /Host Frame:/ && first == "" && !/libcuda\.so/ { first = $0; sub(/.*Host Frame: */, "", first); sub(/ \[0x.*\] in /, " in ", first); sub(/\(.*\) /, " ", first) }
         END { if (open) print what " <- " first }' "$D/$name.log" | grep -v '^========= \(COMPUTE\|ERROR\|LEAK\|RACECHECK\|Target\)' |
    sort | uniq -c | sort -rn | head -n 5 | cut -c1-240 | sed "s/^/gpu-check:   $name reports: /"
  if [ "$rc" -eq 124 ]; then fail "$name did not finish in ${SANITIZE_TIMEOUT:-80} s (see $D/$name.log)"
  elif [ "$rc" -ne 0 ]; then fail "$name exit $rc (see $D/$name.log)"
  elif [ "$ours" -ne 0 ]; then fail "$name: $ours errors of ours (see $D/$name.log)"
  else say "ok $name ($lib in cuBLAS/NCCL kernels or calls)"; fi
}

# ---------------------------------------------------------------- parts
part_tests() {
  begin tests
  "${MPIRUN[@]}" -np 1 "$BIN/test_cuda_backend" > "$D/test_cuda_backend.log" 2>&1 || fail "test_cuda_backend"
  grep -q "SKIPPED" "$D/test_cuda_backend.log" && fail "tests skipped on a GPU machine"
  grep -E "^\[  (PASSED|FAILED|SKIPPED)  \]" "$D/test_cuda_backend.log" | sed 's/^/gpu-check: /'
  local passed
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$D/test_cuda_backend.log" | tail -n 1)
  "$BIN/gemm_peak" > "$OUT/gemm_peak.log" 2>&1 || fail "gemm_peak"
  cat "$OUT/gemm_peak.log"
  verdict "${passed:-0} GPU tests passed; cuBLAS peak bf16 $(field tflops "$OUT/gemm_peak.log" "PEAK dtype=bf16") tf32 $(field tflops "$OUT/gemm_peak.log" "PEAK dtype=tf32") fp32 $(field tflops "$OUT/gemm_peak.log" "PEAK dtype=fp32") TFLOPS"
}

part_correctness() {
  begin correctness
  checks=0
  local small=(--backend cuda --model t5-small --batch 2 --seq-len 64 --steps 2 --warmup 1 --check)
  check_run ddp-fp32 1 ddp_perf "${small[@]}"
  check_run fsdp-fp32 1 fsdp_perf "${small[@]}"
  check_run ddp-bf16-reduce-fp32 1 ddp_perf "${small[@]}" --dtype bf16 --reduce-dtype fp32
  check_run fsdp-bf16 1 fsdp_perf "${small[@]}" --dtype bf16
  check_run fsdp-fp16 1 fsdp_perf "${small[@]}" --dtype fp16
  check_run fsdp-zero1-bf16 1 fsdp_perf "${small[@]}" --sharding optimizer-state --dtype bf16
  # CPU offload: pinned host buffers, the copy streams, the CPU update (docs/usage.md)
  check_run fsdp-offload-params-bf16 1 fsdp_perf "${small[@]}" --cpu-offload params --dtype bf16
  check_run fsdp-zero1-offload-optimizer-bf16 1 fsdp_perf "${small[@]}" --zero-stage 1 --cpu-offload optimizer --dtype bf16
  check_run fsdp-adamw8bit-bf16 1 fsdp_perf "${small[@]}" --optimizer adamw-8bit --dtype bf16
  check_run ddp-sgd-fp32 1 ddp_perf "${small[@]}" --optimizer sgd
  # the opt-in paths (docs/gpu.md): each trains to the single-rank reference
  check_run fsdp-bf16-fused-mma 1 fsdp_perf "${small[@]}" --dtype bf16 --attention fused
  check_run fsdp-bf16-fused-fma 1 fsdp_perf "${small[@]}" --dtype bf16 --attention fused --attention-kernel fma
  check_run ddp-fp32-fused 1 ddp_perf "${small[@]}" --attention fused
  check_run fsdp-fp16-fused-mma 1 fsdp_perf "${small[@]}" --dtype fp16 --attention fused --attention-kernel mma
  check_run fsdp-bf16-epilogues 1 fsdp_perf "${small[@]}" --dtype bf16 --fused-epilogues
  check_run fsdp-bf16-graphs 1 fsdp_perf "${small[@]}" --dtype bf16 --cuda-graphs
  check_run ddp-bf16-all-opt-in 1 ddp_perf "${small[@]}" --dtype bf16 --attention fused --fused-epilogues --cuda-graphs \
    --activation-checkpointing
  if [ "$NGPU" -ge 2 ]; then  # NCCL between real ranks: one rank per GPU
    local np=$((NGPU < 8 ? NGPU : 8))
    check_run "ddp-${np}gpu" "$np" ddp_perf "${small[@]}" --bucket-mb 1
    check_run "fsdp-full-${np}gpu" "$np" fsdp_perf "${small[@]}" --sharding full
    check_run "fsdp-full-bf16-${np}gpu" "$np" fsdp_perf "${small[@]}" --sharding full --dtype bf16
    [ $((np % 2)) -eq 0 ] && check_run "fsdp-hybrid-${np}gpu" "$np" fsdp_perf "${small[@]}" --sharding hybrid --shard-size 2
    check_run "fsdp-zero1-bf16-${np}gpu" "$np" fsdp_perf "${small[@]}" --sharding optimizer-state --dtype bf16
    check_run "fsdp-offload-params-bf16-${np}gpu" "$np" fsdp_perf "${small[@]}" --cpu-offload params --dtype bf16
    check_run "fsdp-zero2-offload-optimizer-${np}gpu" "$np" fsdp_perf "${small[@]}" --zero-stage 2 --cpu-offload optimizer
    # tensor and pipeline parallelism over NCCL (the mpi part runs them on ranks sharing a GPU)
    check_run "ddp-tp2-2gpu-bf16" 2 ddp_perf "${small[@]}" --tp 2 --dtype bf16
    check_run "fsdp-pp2-1f1b-2gpu" 2 fsdp_perf "${small[@]}" --sharding none --pp 2 --micro-batches 2
    check_run "ddp-pp2-gpipe-2gpu-bf16" 2 ddp_perf "${small[@]}" --pp 2 --micro-batches 2 --pp-schedule gpipe --dtype bf16
    if [ "$NGPU" -ge 4 ]; then
      check_run "fsdp-full-pp2-tp2-4gpu" 4 fsdp_perf "${small[@]}" --sharding full --pp 2 --tp 2
      check_run "ddp-pp2-dp2-4gpu-bf16" 4 ddp_perf "${small[@]}" --pp 2 --micro-batches 2 --dtype bf16
    fi
  fi
  # fp32 --check must hold run after run (a discrete failure once showed in 2 of 18 runs).
  local repeat=${CHECK_REPEAT:-20} passed=0 i
  for i in $(seq 1 "$repeat"); do
    "${MPIRUN[@]}" -np 1 "$BIN/ddp_perf" "${small[@]}" --out "$D/repeat.h5" --overwrite > "$D/repeat.log" 2>&1 &&
      grep -q -- "-> PASS" "$D/repeat.log" || { cp "$D/repeat.log" "$D/repeat-failed-$i.log"; break; }
    passed=$((passed + 1))
  done
  [ "$passed" -eq "$repeat" ] || fail "fp32 --check failed at run $((passed + 1)) of $repeat"
  # The whole t5-11.3b under DDP needs ~180 GB: allocation must fail with one clear line.
  "${MPIRUN[@]}" -np 1 "$BIN/ddp_perf" --backend cuda --model t5-11.3b --batch 1 --seq-len 64 --steps 1 --warmup 0 \
    --mem-limit-gib 100000 --out "$D/oom.h5" --overwrite > "$D/oom.log" 2>&1
  local oom_rc=$?
  if [ "$oom_rc" -ne 0 ] && grep -q "fatal: .*out-of-memory" "$D/oom.log"; then
    say "ok out-of-memory: $(grep -o 'out-of-memory: [^;]*' "$D/oom.log" | head -n 1)"
  else
    fail "out-of-memory run (exit $oom_rc, see $D/oom.log)"
  fi
  verdict "$checks --check runs passed; fp32 --check $passed of $repeat in a row; out-of-memory in one line"
}

part_mpi() {
  begin mpi
  checks=0
  local tiny=(--backend cuda --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1 --check)
  # the data-parallel strategies, then the layouts: tensor parallelism, pipelines (their sends
  # and receives staged through pinned host buffers as the collectives are), and both
  local matrix=("ddp ddp_perf --bucket-mb 0.002" "full fsdp_perf --sharding full"
                "hybrid2 fsdp_perf --sharding hybrid --shard-size 2" "grad-op fsdp_perf --sharding grad-op"
                "none fsdp_perf --sharding none" "ddp-tp2 ddp_perf --tp 2"
                "full-tp2 fsdp_perf --sharding full --tp 2" "full-pp2 fsdp_perf --sharding full --pp 2"
                "ddp-pp2-gpipe ddp_perf --pp 2 --pp-schedule gpipe" "zero1 fsdp_perf --sharding optimizer-state"
                "offload-params fsdp_perf --cpu-offload params" "zero1-offload fsdp_perf --zero-stage 1 --cpu-offload optimizer")
  local four_only=("full-pp2-tp2 fsdp_perf --sharding full --pp 2 --tp 2"
                   "zero1-pp2-tp2 fsdp_perf --sharding optimizer-state --pp 2 --tp 2")
  local comm np dt entry label prog args entries
  for comm in ${MPI_COMMS:-mpi}; do
    for np in 2 4; do
      entries=("${matrix[@]}")
      [ "$np" -eq 4 ] && entries+=("${four_only[@]}")
      for dt in fp32 bf16; do
        for entry in "${entries[@]}"; do
          read -r label prog args <<< "$entry"
          # shellcheck disable=SC2086  # args are words
          check_run "check-$comm-$label-$dt-np$np" "$np" "$prog" "${tiny[@]}" --comm "$comm" --dtype "$dt" $args
        done
      done
    done
  done
  grep -h "^collectives:" "$D"/check-mpi-*.log 2>/dev/null | sort -u | sed 's/^/gpu-check: /'
  # memcheck of 2-rank runs: no error on any rank (NCCL is not initialised with --comm mpi)
  local memchecked=0
  for entry in "${matrix[@]:0:3}" "${matrix[6]}" "${matrix[7]}"; do
    read -r label prog args <<< "$entry"
    if [ -z "$SANITIZER" ]; then fail "memcheck: compute-sanitizer not found"; break; fi
    # shellcheck disable=SC2086
    if "${MPIRUN[@]}" -np 2 "$SANITIZER" --tool memcheck --error-exitcode 9 --print-limit 20 "$BIN/$prog" "${tiny[@]}" \
        --comm mpi $args --out "$D/memcheck-$label.h5" --overwrite > "$D/memcheck-$label.log" 2>&1 &&
      grep -q -- "-> PASS" "$D/memcheck-$label.log" &&
      [ "$(grep -c "ERROR SUMMARY: 0 errors" "$D/memcheck-$label.log")" -ge 2 ]; then
      say "ok memcheck-$label (2 ranks)"
      memchecked=$((memchecked + 1))
    else
      fail "memcheck-$label (see $D/memcheck-$label.log)"
    fi
  done
  # NCCL vs MPI, rows of one table
  local coll=(--ops all-reduce,all-gather,reduce-scatter -b 1K -e 256M -f 4 -n 10 -w 3) runs run comms name
  if [ "$NGPU" -ge 2 ]; then runs=("$((NGPU < 8 ? NGPU : 8)) nccl,mpi"); else runs=("1 nccl,mpi" "2 mpi"); fi
  for run in "${runs[@]}"; do
    read -r np comms <<< "$run"
    name="collective_perf-np$np-${comms/,/-}"
    "${MPIRUN[@]}" -np "$np" "$BIN/collective_perf" --backend cuda --comm "$comms" "${coll[@]}" \
      --out "$D/$name.h5" --overwrite > "$D/$name.log" 2>&1 || fail "$name (see $D/$name.log)"
    sed -n '/^# collective_perf/,/^# Avg bus/p' "$D/$name.log" | tail -n 4
  done
  verdict "$checks --check runs over --comm ${MPI_COMMS:-mpi} passed (2 and 4 ranks); memcheck $memchecked of 5 clean"
}

part_sanitize() {
  begin sanitize
  sanitized=()
  local t="$BIN/test_cuda_backend"
  local opt_in=("$BIN/fsdp_perf" --backend cuda --model t5-tiny --batch 2 --seq-len 70 --dec-seq-len 67 --steps 2
                --warmup 1 --dtype bf16 --attention fused --fused-epilogues --cuda-graphs --check --out "$D/opt-in.h5"
                --overwrite)
  local kernels='*FusedAttentionMatchesCpu*:*TensorCore*:*FusedEpilogues*:*SummedGradients*:*Softmax*:*RmsNorm*'
  sanitize_run memcheck-tests memcheck --report-api-errors no -- "$t"
  sanitize_run memcheck-opt-in memcheck --report-api-errors no -- "${opt_in[@]}"
  sanitize_run racecheck-kernels racecheck -- "$t" --gtest_filter="$kernels"
  sanitize_run synccheck-kernels synccheck -- "$t" --gtest_filter="$kernels"
  # One test a run: at e2c3c7f the three together printed 10000 reports in 45 s and did not finish.
  sanitize_run initcheck-fused-attention initcheck -- "$t" --gtest_filter='*FusedAttentionMatchesCpu*'
  sanitize_run initcheck-opt-in initcheck -- "$t" --gtest_filter='*OptInPathsTrainAsTheCpu*'
  sanitize_run initcheck-bf16-step initcheck -- "$t" --gtest_filter='*LowPrecisionT5StepMatchesCpu*'
  # The finding at eca8ffe: an uninitialised read inside a cuBLAS bf16 batched GEMM. This
  # test writes the same GEMM with beta = 0 into a fresh buffer and into one full of NaN:
  # a report here with the test passing is cuBLAS reading memory whose value it does not use.
  sanitize_run initcheck-beta-zero initcheck -- "$t" --gtest_filter='*GemmWithBetaZeroIgnoresC*'
  printf '%s\n' "${sanitized[@]}" | sed 's/^/gpu-check:   /'
  verdict "$(IFS=';'; echo "${sanitized[*]}")"
}

part_perf() {
  begin perf
  [ -s "$OUT/gemm_peak.log" ] || "$BIN/gemm_peak" > "$OUT/gemm_peak.log" 2>&1 || fail "gemm_peak"
  local peak
  peak=$(field tflops "$OUT/gemm_peak.log" "PEAK dtype=bf16")
  local variants=("unfused" "fused-attention --attention fused" "fused-epilogues --fused-epilogues"
                  "cuda-graphs --cuda-graphs" "all-three --attention fused --fused-epilogues --cuda-graphs")
  local models=("t5-611m" "t5-2.28b" "t5-11.3b --layers $LAYERS") m v tag label args ms
  : > "$D/table.txt"
  for m in "${models[@]}"; do
    for v in "${variants[@]}"; do
      read -r label args <<< "$v"
      tag="${m// --layers /-}-$label"
      # shellcheck disable=SC2086  # m and args are words
      if "${MPIRUN[@]}" -np 1 "$BIN/fsdp_perf" --backend cuda --model $m --batch 8 --seq-len 512 --dtype bf16 \
          --steps "$STEPS" --warmup "$WARMUP" --mem-limit-gib "$LIMIT_GIB" $args --out "$D/$tag.h5" --overwrite \
          > "$D/$tag.log" 2>&1; then
        echo "$m|$label|$(field step_ms "$D/$tag.log" RESULT)|$(field tflops_per_rank "$D/$tag.log" RESULT)" >> "$D/table.txt"
      else
        fail "$tag (see $D/$tag.log)"
        echo "$m|$label|-|-" >> "$D/table.txt"
      fi
    done
  done
  awk -F'|' -v peak="$peak" '
    { key = $1; ms[key, $2] = $3; tf[key, $2] = $4; if (!(key in seen)) { seen[key] = 1; order[++n] = key } ; labels[$2] = 1 }
    END {
      printf "fsdp_perf --backend cuda, bf16, batch 8, seq 512, one rank; MFU of the measured bf16 peak (%s TFLOPS)\n", peak
      printf "| model | path | step ms | TFLOPS | MFU | / unfused |\n|---|---|---|---|---|---|\n"
      split("unfused fused-attention fused-epilogues cuda-graphs all-three", L, " ")
      for (i = 1; i <= n; ++i) for (j = 1; j <= 5; ++j) {
        m = order[i]; l = L[j]; a = ms[m, l]; b = ms[m, "unfused"]
        mfu = (tf[m, l] != "" && tf[m, l] != "-" && peak > 0) ? sprintf("%.1f %%", 100 * tf[m, l] / peak) : "-"
        r = (a != "-" && a != "" && b != "-" && b > 0) ? sprintf("%.2fx", a / b) : "-"
        printf "| %s | %s | %s | %s | %s | %s |\n", m, l, a, tf[m, l], mfu, r
        if (j > 1 && r != "-" && a + 0 < b + 0) faster[l]++
      }
      printf "opt-in paths faster than unfused at all %d shapes (docs/gpu.md: may become the CUDA default):", n
      none = 1
      for (j = 2; j <= 5; ++j) if (faster[L[j]] == n) { printf "%s %s", (none ? "" : ","), L[j]; none = 0 }
      if (none) printf " none"
      printf "\n"
    }' "$D/table.txt" | tee "$D/perf.txt"
  local unf mfu11
  unf=$(awk -F'|' '$2 == "unfused" { printf "%s%s", sep, $3; sep = " / " }' "$D/table.txt")
  mfu11=$(awk -F'|' -v peak="$peak" '$1 ~ /t5-11.3b/ && $4 != "-" && peak > 0 { v = 100 * $4 / peak; if (v > best) best = v }
    END { printf "%.1f", best }' "$D/table.txt")
  verdict "unfused ${unf} ms (611m / 2.28b / 11.3b ${LAYERS}+${LAYERS}); best MFU on t5-11.3b layers ${mfu11} % (target >= 60 %); $(tail -n 1 "$D/perf.txt")"
}

part_attention() {
  begin attention
  "$BIN/kernel_bench" --backend cuda --benchmark_filter='^attention/t5-(611m|2\.28b|11\.3b)/' \
    --benchmark_out="$D/kernel_bench.json" --benchmark_out_format=json > "$D/kernel_bench.log" 2>&1 ||
    fail "kernel_bench (see $D/kernel_bench.log)"
  grep "^attention/" "$D/kernel_bench.log"
  local line
  line=$(awk '/^attention\// {
      split($1, f, "/"); if (f[4] != "bf16") next
      for (i = 2; i <= NF; ++i) if ($i ~ /^ms=/) { sub("ms=", "", $i); t[f[2], f[3]] = $i }
      models[f[2]] = 1 }
    END {
      target["t5-611m"] = 0.47; target["t5-2.28b"] = 0.88; target["t5-11.3b"] = 5.10
      split("t5-611m t5-2.28b t5-11.3b", M, " ")
      for (i = 1; i <= 3; ++i) { m = M[i]; best = ""; bp = ""
        split("fused fused-mma fused-fma", P, " ")
        for (j = 1; j <= 3; ++j) if ((m, P[j]) in t && (best == "" || t[m, P[j]] + 0 < best + 0)) { best = t[m, P[j]]; bp = P[j] }
        printf "%s%s: unfused %s ms, %s %s ms (target %.2f)", (i > 1 ? "; " : ""), m, t[m, "unfused"], bp, best, target[m] }
    }' "$D/kernel_bench.log")
  verdict "bf16 forward + backward, batch 8, seq 512: $line"
}

part_hf() {
  begin hf
  MODELS=${HF_MODELS:-t5-611m t5-11.3b} CKPT_MODES=${HF_CKPT:-no} HF_TIMEOUT=${HF_TIMEOUT:-200} \
    OURS_ARGS=${OURS_ARGS:-} STEPS=$STEPS PYTHON=$PYTHON bash scripts/hf-compare.sh "$D" "$LAYERS" || fail "hf-compare"
  local ratios
  ratios=$(awk -F'|' '/^\| t5-/ { gsub(/ /, "", $2); gsub(/ /, "", $7); printf "%s%s %s", sep, $2, $7; sep = ", " }' \
    "$D/hf-compare.txt" 2>/dev/null)
  [ -f "$D/hf-compare.txt" ] || fail "no Hugging Face rows: PyTorch with CUDA and transformers are needed (see $D/hf-probe.log)"
  verdict "ours / torch.compile: ${ratios:-none measured} (target <= 0.85)"
}

for p in "${selected[@]}"; do "part_$p"; done

{
  echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $GPU_NAME ($(hostname)), $(git describe --always --dirty 2>/dev/null)"
  for p in "${PARTS[@]}"; do [ -f "$OUT/$p.verdict" ] && cat "$OUT/$p.verdict"; done
} > "$OUT/summary.txt"
tar czf "$RESULTS/gpu-check.tar.gz" -C "$RESULTS" gpu-check
say "summary: $OUT/summary.txt; everything: $RESULTS/gpu-check.tar.gz"
[ "$any_failed" -eq 0 ]
