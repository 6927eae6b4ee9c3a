#!/usr/bin/env bash
# shardbench's CUDA step against Hugging Face transformers' T5 on the same GPU, in one job:
# by default t5-611m, t5-2.28b and t5-11.3b layers, bf16, batch 8, seq 512, one rank, with and
# without activation checkpointing; Hugging Face eager and under torch.compile
# (analysis/hf_t5_step.py). Each row prints both parameter counts and both step times side by
# side. MODELS picks the presets, e.g. MODELS="t5-v1_1-xl flan-t5-xxl" for T5 v1.1 / Flan-T5
# (gated GELU, untied head, built as the released checkpoints). Models that do not fit one
# GPU whole (t5-11.3b, t5-v1_1-xxl, flan-t5-xxl) run on both sides with the same layer count:
# the largest, from LAYERS down, that Hugging Face eager fits (ours fits wherever its plan
# does; gpu-check chose LAYERS by it).
#
#   scripts/hf-compare.sh OUTDIR [LAYERS]       (scripts/gpu-check.sh calls it)
# Environment: PYTHON (default python3), STEPS (default 5), WARMUP (default 3; compile happens
# in the first), SB_BIN (default build/bin), MODELS (default "t5-611m t5-2.28b t5-11.3b"),
# CKPT_MODES (default "no yes": without and with activation checkpointing), HF_TIMEOUT
# (seconds per Hugging Face run, default none; a run past it counts as failed), OURS_ARGS
# (more flags for ours, e.g. the opt-in paths). Rows where transformers, PyTorch or CUDA is
# missing are skipped with the reason. Prints a table (also OUTDIR/hf-compare.txt); exit 1 if
# any run failed or the two parameter counts differ, 0 otherwise. Target
# (docs/performance.md): ours / compiled <= 0.85.
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
  "${HF_RUN[@]}" analysis/hf_t5_step.py "$@" --bin "$BIN" --steps "$STEPS" --warmup "$WARMUP" > "$log" 2>&1
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

# fit MODEL: the layer count both sides fit (Hugging Face eager is the larger of the two).
fit() {
  local n=$LAYERS r
  while [ "$n" -ge 1 ]; do
    r=$(STEPS=1 WARMUP=1 hf "$OUT/hf-fit-$1-$n.log" --model "$1" --layers "$n" "${SHAPE[@]}")
    [ "$r" != fail ] && { echo "$n"; return; }
    say "$1 with $n+$n layers does not fit Hugging Face eager ($(tail -n 1 "$OUT/hf-fit-$1-$n.log")); trying fewer" >&2
    n=$((n - 1))
  done
  say "$1: Hugging Face fits no layer count here" >&2
  echo 0
}
# params LOG: the parameter count a run printed (ours: the configuration table; HF: params=)
params() { grep -m1 -E '^\| parameters ' "$1" 2>/dev/null | tr -dc '0-9' || true; }

rows=()
for model in $MODELS; do
  extra=()
  N=
  case $model in
    t5-11.3b | t5-v1_1-xxl | flan-t5-xxl)
      N=$(fit "$model")
      [ "$N" -ge 1 ] || continue
      extra=(--layers "$N") ;;
  esac
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
    p_ours=$(params "$OUT/ours-$tag.log")
    p_hf=$(field params "$OUT/hf-eager-$tag.log" HF)
    [ -n "$p_ours" ] && [ -n "$p_hf" ] && [ "$p_ours" != "$p_hf" ] && { say "$tag: parameter counts differ"; failed=1; }
    rows+=("| $model${extra[*]:+ ($N+$N layers)} | $ck | ${p_ours:--} | ${p_hf:--} | $ours | $eager | $compiled | $ratio |")
  done
done

{
  echo "shardbench vs Hugging Face T5 (transformers), bf16, batch 8, seq 512, one GPU, step ms (median)"
  echo "| model | act. ckpt | parameters, ours | parameters, HF | ours | HF eager | HF torch.compile | ours / compiled (target <= 0.85) |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/hf-compare.txt"
exit $failed
