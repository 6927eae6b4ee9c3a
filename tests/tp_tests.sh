#!/usr/bin/env bash
# Tensor parallelism (--tp, Megatron-LM's split) combined with every data-parallel strategy:
# --check against the split reference and the full model in lockstep (a correct split passes,
# five deliberately wrong ones fail, each named in one line), the tensor-parallel
# all-reduces per block read from the trace against the formula, plan = measured peak, the
# plan of any world without allocating, and bad values refused in one line (exit 2).
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
MPI4=(timeout 300 mpirun -np 4 --oversubscribe --bind-to none)
MPI8=(timeout 300 mpirun -np 8 --oversubscribe --bind-to none)
TINY=(--model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1)
check_pattern='check: .* -> PASS'
split_pattern='check: tensor parallelism: the split reference on ranks 0-[0-9]+; against the full model in lockstep .* -> PASS$'
T=$tmp/traces
mkdir -p "$T"

# --- tp 2 × dp 2 (4 ranks): every strategy, fp32 and bf16 ---
for dtype in fp32 bf16; do
  for strat in "ddp_perf" "fsdp_perf --sharding full" "fsdp_perf --sharding none" "fsdp_perf --sharding grad-op" \
    "fsdp_perf --sharding optimizer-state" "fsdp_perf --sharding full --cpu-offload optimizer"; do
    name="tp 2 x dp 2, $strat, $dtype"
    out=$T/$(echo "$strat-$dtype" | tr -c 'a-z0-9\n-' '_').h5
    "${MPI4[@]}" $BIN/$strat "${TINY[@]}" --tp 2 --dtype $dtype --check --out $out >"$tmp/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -qE "$check_pattern" "$tmp/out" && grep -qE "$split_pattern" "$tmp/out"; then
      ok "$name --check"
    else
      echo "      exit $rc" >>"$tmp/out"; bad "$name --check"
    fi
  done
done
# hybrid needs replicas of a shard group: tp 2 × (replicate 2 × shard 2) on 8 ranks
for dtype in fp32 bf16; do
  expect "tp 2 x dp 4, fsdp hybrid 2, $dtype --check" 0 "$split_pattern" -- \
    "${MPI8[@]}" $BIN/fsdp_perf "${TINY[@]}" --tp 2 --sharding hybrid --shard-size 2 --dtype $dtype --check \
    --out $T/hybrid-$dtype.h5
done
# tp 4 × dp 1: the whole world one tensor-parallel group (t5-tiny has 2 heads: 4 here)
for dtype in fp32 bf16; do
  expect "tp 4 x dp 1, fsdp full, $dtype --check" 0 "$split_pattern" -- \
    "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --heads 4 --tp 4 --dtype $dtype --check --out $T/tp4-$dtype.h5
done
expect "tp 2, gated-GELU feed-forward (wi_0, wi_1 split), untied LM head (vocabulary-parallel), bf16 --check" 0 \
  "$split_pattern" -- "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --tp 2 --ffn gated-gelu --tie-embeddings no --dtype bf16 \
  --check --out $T/gated-untied-bf16.h5
expect "tp 2, fused attention, activation checkpointing, fp16 (dynamic loss scale) --check" 0 "$split_pattern" -- \
  "${MPI4[@]}" $BIN/ddp_perf "${TINY[@]}" --tp 2 --attention fused --activation-checkpointing --dtype fp16 --check \
  --out $T/ddp-fused-ckpt-fp16.h5

# The trace: documented fields, plan = measured peak per rank, every collective's axis and
# group, and per block 2 (encoder) / 3 (decoder) all-reduces of batch x seq x d_model each
# way on the tensor-parallel group (tests/check_trace.py, tensor_parallel_counts).
expect "tensor-parallel traces: all-reduces per block, axes, plan = peak (python check)" 0 '^ok .*tp4-bf16.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/ddp_perf-fp32.h5 $T/fsdp_perf_--sharding_full-bf16.h5 \
  $T/fsdp_perf_--sharding_grad-op-fp32.h5 $T/ddp-fused-ckpt-fp16.h5 $T/gated-untied-bf16.h5 $T/tp4-fp32.h5 \
  $T/tp4-bf16.h5 $T/fsdp_perf_--sharding_optimizer-state-bf16.h5
expect "8-rank hybrid tensor-parallel traces (python check)" 0 '^ok .*hybrid-bf16.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 8 --steps 3 $T/hybrid-fp32.h5 $T/hybrid-bf16.h5
expect "the trace records the 2-D mesh" 0 '^tp 2 dp 2 shard 2 replicas 1 groups \[0, 1\] \[1, 3\]$' -- $PY -c "
import sys; sys.path.insert(0, '$ROOT/analysis'); import shardbench_h5
r = shardbench_h5.load('$T/fsdp_perf_--sharding_full-bf16.h5'); m = r.meta
print('tp', m['tp_size'], 'dp', m['dp_size'], 'shard', m['shard_size'], 'replicas', m['replicas'], 'groups',
      r.group(1, 'tp'), r.group(1, 'dp_shard'))"

# A broken split, five ways (SHARDBENCH_INJECT_FAULT, include/shardbench/core/fault.h). The
# split reference runs the same code, so it agrees with the run; the lockstep names the first
# sum over the group that leaves its rounding bound of the full model's. The last is the
# tightness probe: an fp32 run whose input gradients are summed over the group in bf16 (each
# part and the sum rounded to 8 bits) is within 0.0063 of the gradients' norm, inside the
# former check's 0.1; its rounding bound is 2^-24 per rounding.
first_difference='check: tensor parallelism: first difference: step 1: data-parallel rank 0.s step,'
faults=(
  "tp-skip-attention-all-reduce|backward of decoder block 1: the group.s sum of the cross-attention input gradient, element [0-9]+ of 512, .* x its rounding bound"
  "tp-skip-feed-forward-all-reduce|forward of encoder block 0: the group.s sum of the feed-forward output, element [0-9]+ of 768, .* x its rounding bound"
  "tp-wrong-head-shard|forward of encoder block 0: the group.s sum of the self-attention output, element [0-9]+ of 768, .* x its rounding bound"
  "tp-wrong-vocab-offset|forward of the encoder embedding: the group.s sum of the encoder embedding, element [0-9]+ of 768, .* x its rounding bound"
  "tp-bf16-gradient-all-reduce|backward of the head: the group.s sum of the LM head input gradient, element [0-9]+ of 512, .* apart, [0-9.e+]+ x its rounding bound"
)
for f in "${faults[@]}"; do
  fault=${f%%|*}
  expect "injected fault $fault: --check fails, naming the sum" 4 "$first_difference ${f#*|}" -- \
    env SHARDBENCH_INJECT_FAULT=$fault "${MPI4[@]}" -x SHARDBENCH_INJECT_FAULT \
    $BIN/fsdp_perf "${TINY[@]}" --tp 2 --check --out $T/fault-$fault.h5
done

# --- the plan: any world, nothing allocated; per-rank parameters and FLOPs are the share ---
# "Without allocating": the process's resident high-water mark (/usr/bin/time's maxrss) is
# that of planning t5-tiny, whose plan is 3 orders of magnitude smaller, to within 1/16 of
# the planned peak per rank (1.43 GiB: its parameters, gradients and Adam state alone are
# 295 MiB), so allocating any sizeable part of one rank's plan - let alone one rank's share
# of the 11.3 B parameters, 2.6 GiB in bf16 - fails it. MALLOC_PERTURB_ makes glibc fill
# every allocation, so memory allocated but never touched counts as well.
expect "--plan --world-size 512 --tp 8 plans t5-11.3b without allocating" 0 \
  '^parameters 11,307,321,344 \(1,41[0-9],[0-9,]+ per rank\); planned peak [0-9]+ KiB per rank; maxrss [0-9]+ KiB, t5-tiny plan [0-9]+ KiB: [0-9-]+ KiB more < peak / 16$' -- \
  bash -c "
    [ -x /usr/bin/time ] || { echo '/usr/bin/time is not installed'; exit 1; }
    export MALLOC_PERTURB_=165
    /usr/bin/time -f 'maxrss_kb %M' $BIN/fsdp_perf --model t5-tiny --plan >$tmp/plan-tiny 2>&1 || exit 1
    /usr/bin/time -f 'maxrss_kb %M' $BIN/fsdp_perf --model t5-11.3b --batch 8 --seq-len 512 --dtype bf16 \
      --activation-checkpointing --tp 8 --plan --world-size 512 --mem-limit-gib 80 >$tmp/plan-big 2>&1 || exit 1
    $PY - $tmp/plan-tiny $tmp/plan-big <<'PY'
import re, sys
tiny, big = (open(p).read() for p in sys.argv[1:])
rss = lambda t: int(re.search(r'^maxrss_kb (\d+)$', t, re.M).group(1))
params = re.search(r'^\| parameters +\| ([0-9,]+( \([0-9,]+ per rank\))?)', big, re.M).group(1)
v, unit = re.search(r'^  total peak +([0-9.]+) (KiB|MiB|GiB)', big, re.M).groups()
peak = float(v) * {'KiB': 1, 'MiB': 1024, 'GiB': 1024 ** 2}[unit]
more = rss(big) - rss(tiny)
print(f'parameters {params}; planned peak {peak:.0f} KiB per rank; maxrss {rss(big)} KiB, t5-tiny plan {rss(tiny)} KiB:'
      f' {more} KiB more ' + ('<' if more < peak / 16 else '>=') + ' peak / 16')
sys.exit(0 if more < peak / 16 else 1)
PY"
expect "the plan's FLOPs per rank are the model's / tp, all issued by the schedule" 0 \
  'FLOPs per rank per step: model 3.845e\+13 \(3 x forward\), hardware 5.123e\+13, issued by the schedule 5.123e\+13' -- \
  $BIN/fsdp_perf --model t5-11.3b --batch 8 --seq-len 512 --dtype bf16 --activation-checkpointing --tp 8 \
  --plan --world-size 512 --mem-limit-gib 80

# --- bad values: one line, exit 2, nothing written ---
expect "--tp 3 with 16 heads names the heads and their divisors" 2 \
  'error: --tp 3 is not allowed with heads 16 \(the heads, d_ff and vocab must divide by --tp; heads 16 divides by 1, 2, 4, 8, 16\)$' -- \
  $BIN/fsdp_perf --model t5-611m --tp 3 --plan --world-size 6
expect "--tp not dividing the world" 2 '--tp 8 is not allowed with world size 4 \(must divide it' -- \
  "${MPI4[@]}" $BIN/ddp_perf "${TINY[@]}" --heads 8 --tp 8 --out $T/bad.h5
expect "--tp 0" 2 '--tp 0 is not allowed' -- $BIN/ddp_perf --tp 0
expect "hybrid shard size beyond the data-parallel ranks" 2 \
  '--shard-size 4 is not allowed with world size 4 and 2 data-parallel ranks' -- \
  "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --tp 2 --sharding hybrid --shard-size 4 --out $T/bad.h5
if [ -e $T/bad.h5 ] || ls $T/bad.h5.*tmp >/dev/null 2>&1; then
  echo "file left" >"$tmp/out"; bad "no file after bad --tp input"
else ok "no file after bad --tp input"; fi

summary
