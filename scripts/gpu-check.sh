#!/usr/bin/env bash
# make gpu-check: the CUDA backend on a machine WITH a GPU, in one job.
#   1. prerequisites (a visible GPU, mpirun, nvcc, make), said clearly when missing
#   2. build (make -j), then the GPU tests (build/bin/test_cuda_backend, no skips allowed)
#   3. cuBLAS peak of this GPU (build/bin/gemm_peak: bf16, tf32, fp32)
#   4. correctness runs: --check on one rank (and on every GPU with NCCL when there are
#      several), the multi-rank --check matrix over MPI with 2 and 4 ranks sharing the GPU(s)
#      (--comm mpi: DDP; FSDP full, hybrid 2, grad-op, none; fp32 and bf16), each also under
#      compute-sanitizer memcheck; memcheck, racecheck, synccheck and initcheck on the GPU
#      tests and on a t5-tiny run of each strategy; fp32 --check CHECK_REPEAT (50) times in a
#      row; NCCL vs MPI collective_perf rows in one table; and an out-of-memory run that must
#      fail with one clear "out-of-memory" line
#   5. t5-11.3b layer shapes on ONE rank: the largest --layers N whose bf16 memory plan fits
#      the GPU (seq 512, batch 8 or what fits, activation checkpointing if needed), timed
#      with ddp_perf and fsdp_perf --backend cuda in bf16 (the target) and fp32 (where its
#      plan fits), and with analysis/torch_t5_step.py (PyTorch, same shapes, same GPU, same
#      job, fp32 and bf16 autocast)
#      and with Hugging Face transformers' T5, eager and torch.compile, on three models
#      (scripts/hf-compare.sh; skipped with the reason where transformers is absent)
#   6. a table: step TFLOPS, measured peaks, MFU against them, PyTorch step time and ratio
#      (each of ours against PyTorch in the same precision), then the Hugging Face table
# Raw outputs go to results/gpu-check/. Exit 0 when every step passed, 1 otherwise.
# Environment: GPU_CHECK_HEADROOM (fraction of GPU memory the plan may use, default 0.90),
# LAYERS / BATCH / CKPT=1 (skip the plan search), STEPS (default 5), WARMUP (default 2),
# SKIP_BUILD=1, PYTHON (default python3), SB_CUDA_TF32=1 (TF32 GEMMs in ours and PyTorch's),
# MPI_COMMS (the --comm values of the MPI matrix, default "mpi"; e.g. "mpi mpi-staged" to run
# the staged path too on a CUDA-aware MPI), MEMCHECK=0 (skip the memcheck runs), SANITIZE=0
# (skip the four sanitizer tools), CHECK_REPEAT (default 50).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=$ROOT/results/gpu-check
BIN=$ROOT/build/bin
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
HEADROOM=${GPU_CHECK_HEADROOM:-0.90}
SEQ=512
failed=()

say() { echo "gpu-check: $*"; }
fail() { failed+=("$1"); say "FAILED: $1"; }
die() { echo "gpu-check: error: $*" >&2; exit 1; }
# field NAME FILE PREFIX: value of NAME=... on the last line of FILE starting with PREFIX
field() { grep -E "^$3" "$2" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# ---------------------------------------------------------------- 1. prerequisites
command -v nvidia-smi >/dev/null ||
  die "no GPU visible: nvidia-smi not found (no NVIDIA driver on this host). Run make gpu-check on a GPU node."
nvidia-smi -L >/dev/null 2>&1 ||
  die "no GPU visible: nvidia-smi -L failed: $(nvidia-smi -L 2>&1 | head -n 1)"
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
say "$NGPU GPU(s), GPU 0: $GPU_NAME, $GPU_MIB MiB; plans may use $LIMIT_GIB GiB (headroom $HEADROOM)"

# ---------------------------------------------------------------- 2. build and GPU tests
if [ -z "${SKIP_BUILD:-}" ]; then
  say "building (log: $OUT/build.log)"
  make -j"$(nproc)" > "$OUT/build.log" 2>&1 || die "build failed: see $OUT/build.log"
fi
for b in test_cuda_backend gemm_peak ddp_perf fsdp_perf collective_perf; do
  [ -x "$BIN/$b" ] || die "$BIN/$b was not built: the CUDA parts need nvcc, cuBLAS and NCCL (make probe)"
done
say "GPU tests (log: $OUT/test_cuda_backend.log)"
"${MPIRUN[@]}" -np 1 "$BIN/test_cuda_backend" > "$OUT/test_cuda_backend.log" 2>&1 || fail "test_cuda_backend"
grep -q "SKIPPED" "$OUT/test_cuda_backend.log" && fail "test_cuda_backend skipped tests on a GPU machine"
tail -n 3 "$OUT/test_cuda_backend.log"

# ---------------------------------------------------------------- 3. cuBLAS peak
say "cuBLAS peak (log: $OUT/gemm_peak.log)"
"$BIN/gemm_peak" > "$OUT/gemm_peak.log" 2>&1 || fail "gemm_peak"
cat "$OUT/gemm_peak.log"
PEAK_BF16=$(field tflops "$OUT/gemm_peak.log" "PEAK dtype=bf16")
PEAK_TF32=$(field tflops "$OUT/gemm_peak.log" "PEAK dtype=tf32")
PEAK_FP32=$(field tflops "$OUT/gemm_peak.log" "PEAK dtype=fp32")

# ---------------------------------------------------------------- 4. correctness runs
SMALL=(--backend cuda --model t5-small --batch 2 --seq-len 64 --steps 2 --warmup 1 --check)
check_run() {  # check_run NAME NP PROGRAM ARGS...: --check must PASS
  local name=$1 np=$2 prog=$3
  shift 3
  if "${MPIRUN[@]}" -np "$np" "$BIN/$prog" "$@" --out "$OUT/$name.h5" --overwrite > "$OUT/$name.log" 2>&1 &&
    grep -q -- "-> PASS" "$OUT/$name.log"; then
    say "ok $name"
  else
    fail "$name (see $OUT/$name.log)"
  fi
}
check_run check-ddp-1gpu 1 ddp_perf "${SMALL[@]}"
check_run check-fsdp-1gpu 1 fsdp_perf "${SMALL[@]}"
check_run check-ddp-bf16-1gpu 1 ddp_perf "${SMALL[@]}" --dtype bf16 --reduce-dtype fp32
check_run check-fsdp-bf16-1gpu 1 fsdp_perf "${SMALL[@]}" --dtype bf16
check_run check-fsdp-fp16-1gpu 1 fsdp_perf "${SMALL[@]}" --dtype fp16
if [ "$NGPU" -ge 2 ]; then  # NCCL between real ranks: one rank per GPU
  NP=$((NGPU < 8 ? NGPU : 8))
  check_run "check-ddp-${NP}gpu" "$NP" ddp_perf "${SMALL[@]}" --bucket-mb 1
  check_run "check-fsdp-full-${NP}gpu" "$NP" fsdp_perf "${SMALL[@]}" --sharding full
  check_run "check-fsdp-full-bf16-${NP}gpu" "$NP" fsdp_perf "${SMALL[@]}" --sharding full --dtype bf16
  [ $((NP % 2)) -eq 0 ] &&
    check_run "check-fsdp-hybrid-${NP}gpu" "$NP" fsdp_perf "${SMALL[@]}" --sharding hybrid --shard-size 2
fi
# Over MPI ranks may share a GPU (NCCL refuses): the multi-rank paths run on one GPU too.
TINY=(--backend cuda --model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1 --check)
MPI_MATRIX=("ddp ddp_perf --bucket-mb 0.002" "full fsdp_perf --sharding full" "hybrid2 fsdp_perf --sharding hybrid --shard-size 2"
            "grad-op fsdp_perf --sharding grad-op" "none fsdp_perf --sharding none")
SANITIZER=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
[ -x "$SANITIZER" ] || SANITIZER=$(command -v compute-sanitizer || true)
memcheck_run() {  # memcheck_run NAME NP PROGRAM ARGS...: --check PASS and no memcheck error on any rank
  local name=$1 np=$2 prog=$3
  shift 3
  if [ -z "$SANITIZER" ]; then fail "$name: compute-sanitizer not found (CUDA toolkit)"; return; fi
  if "${MPIRUN[@]}" -np "$np" "$SANITIZER" --tool memcheck --error-exitcode 9 --print-limit 20 "$BIN/$prog" "$@" \
      --out "$OUT/$name.h5" --overwrite > "$OUT/$name.log" 2>&1 &&
    grep -q -- "-> PASS" "$OUT/$name.log" &&
    [ "$(grep -c "ERROR SUMMARY: 0 errors" "$OUT/$name.log")" -ge "$np" ]; then
    say "ok $name"
  else
    fail "$name (see $OUT/$name.log)"
  fi
}
for comm in ${MPI_COMMS:-mpi}; do
  for np in 2 4; do
    for dt in fp32 bf16; do
      for entry in "${MPI_MATRIX[@]}"; do
        read -r label prog args <<< "$entry"
        # shellcheck disable=SC2086  # args are words
        check_run "check-$comm-$label-$dt-np$np" "$np" "$prog" "${TINY[@]}" --comm "$comm" --dtype "$dt" $args
        # shellcheck disable=SC2086
        [ "${MEMCHECK:-1}" = 0 ] ||
          memcheck_run "memcheck-$comm-$label-$dt-np$np" "$np" "$prog" "${TINY[@]}" --comm "$comm" --dtype "$dt" $args
      done
    done
  done
done
grep -h "^collectives:" "$OUT"/check-mpi-*.log 2>/dev/null | sort -u | sed 's/^/gpu-check: /'

# NCCL vs MPI, rows of one table: one rank per GPU where there are several; on one GPU NCCL
# has a single rank (nothing crosses a link) and MPI 2 ranks sharing it.
COLL=(--ops all-reduce,all-gather,reduce-scatter -b 1K -e 256M -f 4 -n 10 -w 3)
if [ "$NGPU" -ge 2 ]; then
  coll_runs=("$NP nccl,mpi")
else
  coll_runs=("1 nccl,mpi" "2 mpi")
fi
for run in "${coll_runs[@]}"; do
  read -r np comms <<< "$run"
  name="collective_perf-np$np-${comms/,/-}"
  say "collective_perf --backend cuda --comm $comms on $np rank(s) (log: $OUT/$name.log)"
  "${MPIRUN[@]}" -np "$np" "$BIN/collective_perf" --backend cuda --comm "$comms" "${COLL[@]}" \
    --out "$OUT/$name.h5" --overwrite > "$OUT/$name.log" 2>&1 || fail "$name (see $OUT/$name.log)"
  sed -n '/^# collective_perf/,/^# Avg bus/p' "$OUT/$name.log"
done

# compute-sanitizer's four tools on the GPU tests and on a t5-tiny --check of each strategy
# (one rank, NCCL): no error may be reported.
sanitize_run() {  # sanitize_run NAME TOOL COMMAND...: exit 0 and "ERROR SUMMARY: 0 errors"
  local name=$1 tool=$2
  shift 2
  if [ -z "$SANITIZER" ]; then fail "$name: compute-sanitizer not found (CUDA toolkit)"; return; fi
  if "${MPIRUN[@]}" -np 1 "$SANITIZER" --tool "$tool" --error-exitcode 9 --print-limit 20 "$@" \
      > "$OUT/$name.log" 2>&1 && grep -q "ERROR SUMMARY: 0 errors" "$OUT/$name.log"; then
    say "ok $name"
  else
    fail "$name (see $OUT/$name.log)"
  fi
}
if [ "${SANITIZE:-1}" != 0 ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    sanitize_run "$tool-test_cuda_backend" "$tool" "$BIN/test_cuda_backend"
    for entry in "${MPI_MATRIX[@]}"; do
      read -r label prog args <<< "$entry"
      # shellcheck disable=SC2086  # args are words
      sanitize_run "$tool-$label-1gpu" "$tool" "$BIN/$prog" "${TINY[@]}" $args --out "$OUT/$tool-$label.h5" --overwrite
    done
  done
fi

# fp32 --check must hold run after run (a discrete failure once showed in 2 of 18 runs).
REPEAT=${CHECK_REPEAT:-50}
passed=0
for i in $(seq 1 "$REPEAT"); do
  "${MPIRUN[@]}" -np 1 "$BIN/ddp_perf" "${SMALL[@]}" --out "$OUT/repeat.h5" --overwrite > "$OUT/repeat.log" 2>&1 &&
    grep -q -- "-> PASS" "$OUT/repeat.log" || { cp "$OUT/repeat.log" "$OUT/repeat-failed-$i.log"; break; }
  passed=$((passed + 1))
done
if [ "$passed" -eq "$REPEAT" ]; then say "ok fp32 --check passed $REPEAT runs in a row"
else fail "fp32 --check failed at run $((passed + 1)) of $REPEAT (see $OUT/repeat-failed-$((passed + 1)).log)"; fi

# The whole t5-11.3b under DDP needs ~180 GB: allocation must fail with one clear line.
"${MPIRUN[@]}" -np 1 "$BIN/ddp_perf" --backend cuda --model t5-11.3b --batch 1 --seq-len 64 --steps 1 --warmup 0 \
  --mem-limit-gib 100000 --out "$OUT/oom.h5" --overwrite > "$OUT/oom.log" 2>&1
oom_rc=$?
if [ "$oom_rc" -ne 0 ] && grep -q "fatal: .*out-of-memory" "$OUT/oom.log"; then
  say "ok out-of-memory is reported: $(grep -o 'out-of-memory: [^;]*' "$OUT/oom.log" | head -n 1)"
else
  fail "out-of-memory run (exit $oom_rc, see $OUT/oom.log)"
fi

# ---------------------------------------------------------------- 5. t5-11.3b layers on one rank
plan_fits() {  # plan_fits LAYERS BATCH CKPT_FLAG [DTYPE]: both programs' plans fit the GPU
  local p
  for p in ddp_perf fsdp_perf; do
    "${MPIRUN[@]}" -np 1 "$BIN/$p" --plan --model t5-11.3b --layers "$1" --batch "$2" --seq-len $SEQ $3 \
      --dtype "${4:-bf16}" --mem-limit-gib "$LIMIT_GIB" >> "$OUT/plan.log" 2>&1 || return 1
  done
}
largest_fit() {  # largest_fit BATCH CKPT_FLAG: the largest layer count in 1..24 that fits, else 0
  local lo=0 hi=24 mid  # memory grows with the layer count: bisect
  while [ "$lo" -lt "$hi" ]; do
    mid=$(((lo + hi + 1) / 2))
    if plan_fits "$mid" "$1" "$2"; then lo=$mid; else hi=$((mid - 1)); fi
  done
  echo "$lo"
}
: > "$OUT/plan.log"
if [ -n "${LAYERS:-}" ]; then
  N=$LAYERS B=${BATCH:-8} CKPT=${CKPT:+--activation-checkpointing}
else
  N=0
  for CKPT in "" --activation-checkpointing; do
    for B in 8 4 2 1; do
      N=$(largest_fit "$B" "$CKPT")
      [ "$N" -gt 0 ] && break
    done
    [ "$N" -gt 0 ] && break
  done
  [ "$N" -gt 0 ] || die "not even one t5-11.3b layer fits $LIMIT_GIB GiB at batch 1 (see $OUT/plan.log)"
fi
SHAPE=(--model t5-11.3b --layers "$N" --batch "$B" --seq-len $SEQ)
say "shapes: t5-11.3b layers $N+$N, batch $B, seq $SEQ ${CKPT:-(no checkpointing)}"
FP32_FITS=1
plan_fits "$N" "$B" "$CKPT" fp32 || FP32_FITS=
for dt in bf16 fp32; do
  if [ "$dt" = fp32 ] && [ -z "$FP32_FITS" ]; then
    say "fp32 does not fit these shapes (plan: $OUT/plan.log): fp32 rows left out"
    continue
  fi
  for p in ddp_perf fsdp_perf; do
    say "$p --backend cuda --dtype $dt (log: $OUT/${p}_$dt.log)"
    "${MPIRUN[@]}" -np 1 "$BIN/$p" --backend cuda "${SHAPE[@]}" $CKPT --dtype "$dt" --steps "$STEPS" \
      --warmup "$WARMUP" --mem-limit-gib "$LIMIT_GIB" --out "$OUT/${p}_$dt.h5" --overwrite > "$OUT/${p}_$dt.log" 2>&1 ||
      fail "$p --dtype $dt"
    grep -E "^(RESULT|  step time|  TFLOPS|  compute|  GEMM rate|  peak memory)" "$OUT/${p}_$dt.log"
  done
done
TORCH_ARGS=(--model t5-11.3b --layers "$N" --batch "$B" --seq-len $SEQ --steps "$STEPS" --warmup "$WARMUP")
[ -n "$CKPT" ] && TORCH_ARGS+=(--activation-checkpointing)
[ "${SB_CUDA_TF32:-}" = 1 ] && TORCH_ARGS+=(--tf32)
if "$PYTHON" -c "import torch, numpy; assert torch.cuda.is_available()" > "$OUT/torch-probe.log" 2>&1; then
  for dt in fp32 bf16; do
    say "PyTorch $dt (log: $OUT/torch_$dt.log)"
    "$PYTHON" analysis/torch_t5_step.py "${TORCH_ARGS[@]}" --dtype "$dt" > "$OUT/torch_$dt.log" 2>&1 ||
      fail "torch_t5_step --dtype $dt (see $OUT/torch_$dt.log; out of memory at these shapes?)"
    grep "^TORCH" "$OUT/torch_$dt.log"
  done
else
  fail "PyTorch with CUDA is not available to $PYTHON (see $OUT/torch-probe.log): no PyTorch comparison"
fi

# Hugging Face transformers' T5, eager and torch.compile, against ours on the same GPU.
bash scripts/hf-compare.sh "$OUT/hf" "$N" || fail "hf-compare (see $OUT/hf/)"

# ---------------------------------------------------------------- 6. the table
OWN_FP32_PEAK=$PEAK_FP32 OWN_FP32_NAME=fp32  # fp32 GEMMs run on TF32 tensor cores with SB_CUDA_TF32=1
[ "${SB_CUDA_TF32:-}" = 1 ] && OWN_FP32_PEAK=$PEAK_TF32 OWN_FP32_NAME=tf32
row() {  # row NAME LOG PREFIX MS_FIELD TF_FIELD DTYPE TORCH_LOG|torch
  local ms tf base=-
  ms=$(field "$4" "$2" "$3")
  tf=$(field "$5" "$2" "$3")
  [ "$7" = torch ] || base=$(field step_ms "$7" TORCH)
  echo "$1 ${ms:--} ${tf:--} $6 ${base:--} $7"
}
{
  echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $GPU_NAME ($(hostname)), $(git describe --always --dirty 2>/dev/null)"
  echo "shapes: t5-11.3b, layers $N+$N, batch $B, seq $SEQ/$SEQ, ${CKPT:-no activation checkpointing}, 1 rank"
  echo "measured cuBLAS peak (gemm_peak, 8192^3): bf16 ${PEAK_BF16:-?}  tf32 ${PEAK_TF32:-?}  fp32 ${PEAK_FP32:-?} TFLOPS"
  echo "TFLOPS are model FLOPs (3 x forward) per second; MFU = TFLOPS / the measured peak of the run's precision"
  echo "(fp32 rows: $OWN_FP32_NAME). Ours: fp32 master weights and Adam, gathers, compute and gradients in the"
  echo "dtype; PyTorch bf16: fp32 weights under bf16 autocast. Targets (bf16): MFU >= 60%, time / PyTorch <= 0.90x."
  awk -v f32="$OWN_FP32_PEAK" -v bf16="$PEAK_BF16" '
    function missing(a) { return a == "" || a == "-" }
    function pct(a, b) { return (missing(a) || missing(b) || b == 0) ? "-" : sprintf("%.1f%%", 100 * a / b) }
    function num(a, f) { return missing(a) ? "-" : sprintf(f, a) }
    function ratio(a, b) { return (missing(a) || missing(b) || b == 0) ? "-" : sprintf("%.2fx", a / b) }
    BEGIN {
      printf "| %-22s | %10s | %8s | %8s | %21s |\n", "run", "step ms", "TFLOPS", "MFU", "time / PyTorch (same)"
      printf "|%s|%s|%s|%s|%s|\n", "------------------------", "------------", "----------", "----------", "-----------------------"
    }
    { printf "| %-22s | %10s | %8s | %8s | %21s |\n", $1, num($2, "%.1f"), num($3, "%.2f"),
        pct($3, $4 == "bf16" ? bf16 : f32), ratio($2, $5) }' <<EOF
$(row "ddp_perf(cuda,bf16)" "$OUT/ddp_perf_bf16.log" RESULT step_ms tflops_per_rank bf16 "$OUT/torch_bf16.log")
$(row "fsdp_perf(cuda,bf16)" "$OUT/fsdp_perf_bf16.log" RESULT step_ms tflops_per_rank bf16 "$OUT/torch_bf16.log")
$(row "ddp_perf(cuda,fp32)" "$OUT/ddp_perf_fp32.log" RESULT step_ms tflops_per_rank fp32 "$OUT/torch_fp32.log")
$(row "fsdp_perf(cuda,fp32)" "$OUT/fsdp_perf_fp32.log" RESULT step_ms tflops_per_rank fp32 "$OUT/torch_fp32.log")
$(row PyTorch-bf16 "$OUT/torch_bf16.log" TORCH step_ms tflops bf16 torch)
$(row PyTorch-fp32 "$OUT/torch_fp32.log" TORCH step_ms tflops fp32 torch)
EOF
  [ -f "$OUT/hf/hf-compare.txt" ] && cat "$OUT/hf/hf-compare.txt"
  if [ ${#failed[@]} -eq 0 ]; then echo "gpu-check: all steps passed"; else printf 'gpu-check: FAILED: %s\n' "${failed[@]}"; fi
} | tee "$OUT/summary.txt"
[ ${#failed[@]} -eq 0 ]
