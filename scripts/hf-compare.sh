#!/usr/bin/env bash
# shardbench's CUDA step against Hugging Face transformers' T5 on the same GPU, in one job:
# t5-611m, t5-2.28b and t5-11.3b layers, bf16, batch 8, seq 512, one rank, with and without
# activation checkpointing; Hugging Face eager and under torch.compile (analysis/hf_t5_step.py).
# For t5-11.3b both sides run the same layer count: the largest, from LAYERS down, that
# Hugging Face eager fits (ours fits wherever its plan does; gpu-check passes its LAYERS, 4).
#
#   scripts/hf-compare.sh OUTDIR [LAYERS]       (scripts/gpu-check.sh calls it)
# Environment: PYTHON (default python3), STEPS (default 5), WARMUP (default 3; compile happens
# in the first), SB_BIN (default build/bin), MODELS (default "t5-611m t5-2.28b t5-11.3b"),
# CKPT_MODES (default "no yes": without and with activation checkpointing), HF_TIMEOUT
# (seconds per Hugging Face run, default none; a run past it counts as failed), OURS_ARGS
# (more flags for ours, e.g. the opt-in paths). Rows where transformers, PyTorch or CUDA is
# missing are skipped with the reason. Prints a table (also OUTDIR/hf-compare.txt); exit 1 if
# any run failed, 0 otherwise. Target (docs/performance.md): ours / compiled <= 0.85.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh  # as root: mpirun's permission; the same MPI settings as gpu-check
OUT=${1:?usage: scripts/hf-compare.sh OUTDIR [LAYERS]}
LAYERS=${2:-4}
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-3}
BIN=${SB_BIN:-build/bin}
MODELS=${MODELS:-t5-611m t5-2.28b t5-11.3b}
CKPT_MODES=${CKPT_MODES:-no yes}
read -r -a OURS_EXTRA <<< "${OURS_ARGS:-}"
HF_RUN=("$PYTHON")
[ -n "${HF_TIMEOUT:-}" ] && HF_RUN=(timeout "$HF_TIMEOUT" "$PYTHON")
SHAPE=(--batch 8 --seq-len 512)
mkdir -p "$OUT"
failed=0
say() { echo "hf-compare: $*"; }
field() { grep -E "^$3" "$2" 2>/dev/null | tail -n 1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# hf LOG ARGS...: runs hf_t5_step; prints its step_ms, "skip" (not available) or "fail"
hf() {
  local log=$1
  shift
  "${HF_RUN[@]}" analysis/hf_t5_step.py "$@" --steps "$STEPS" --warmup "$WARMUP" > "$log" 2>&1
  case $? in
    0) field step_ms "$log" HF ;;
    3) echo skip ;;
    *) echo fail ;;
  esac
}

if ! "$PYTHON" -c "import torch, transformers; assert torch.cuda.is_available()" > "$OUT/hf-probe.log" 2>&1; then
  say "skipped: Hugging Face rows need PyTorch with CUDA and transformers ($(tail -n 1 "$OUT/hf-probe.log"))"
  exit 0
fi

# The t5-11.3b layer count both sides fit: Hugging Face eager is the larger of the two.
N=$LAYERS
[[ " $MODELS " == *" t5-11.3b "* ]] || N=0
while [ "$N" -ge 1 ]; do
  r=$(STEPS=1 WARMUP=1 hf "$OUT/hf-fit-$N.log" --model t5-11.3b --layers "$N" "${SHAPE[@]}")
  [ "$r" != fail ] && break
  say "t5-11.3b with $N+$N layers does not fit Hugging Face eager ($(tail -n 1 "$OUT/hf-fit-$N.log")); trying fewer"
  N=$((N - 1))
done
[ "$N" -ge 1 ] || { say "t5-11.3b: Hugging Face fits no layer count here"; N=0; }

rows=()
for model in $MODELS; do
  extra=()
  if [ "$model" = t5-11.3b ]; then
    [ "$N" -ge 1 ] || continue
    extra=(--layers "$N")
  fi
  for mode in $CKPT_MODES; do
    ckpt=
    [ "$mode" = yes ] && ckpt=--activation-checkpointing
    tag="$model${extra[*]:+-${N}layers}${ckpt:+-ckpt}"
    say "$tag: ours (fsdp_perf --backend cuda), Hugging Face eager, torch.compile"
    ours=fail
    if mpirun -np 1 "$BIN/fsdp_perf" --backend cuda --model "$model" "${extra[@]}" "${SHAPE[@]}" $ckpt --dtype bf16 \
      "${OURS_EXTRA[@]}" \
      --steps "$STEPS" --warmup 2 --out "$OUT/ours-$tag.h5" --overwrite > "$OUT/ours-$tag.log" 2>&1; then
      ours=$(field step_ms "$OUT/ours-$tag.log" RESULT)
    fi
    eager=$(hf "$OUT/hf-eager-$tag.log" --model "$model" "${extra[@]}" "${SHAPE[@]}" $ckpt)
    compiled=$(hf "$OUT/hf-compile-$tag.log" --model "$model" "${extra[@]}" "${SHAPE[@]}" $ckpt --compile)
    for r in "$ours" "$eager" "$compiled"; do [ "$r" = fail ] && failed=1; done
    ratio=$(awk -v a="$ours" -v b="$compiled" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "-" }')
    ck=no
    [ -n "$ckpt" ] && ck=yes
    rows+=("| $model${extra[*]:+ ($N+$N layers)} | $ck | $ours | $eager | $compiled | $ratio |")
  done
done

{
  echo "shardbench vs Hugging Face T5 (transformers), bf16, batch 8, seq 512, one GPU, step ms (median)"
  echo "| model | act. ckpt | ours | HF eager | HF torch.compile | ours / compiled (target <= 0.85) |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/hf-compare.txt"
exit $failed
