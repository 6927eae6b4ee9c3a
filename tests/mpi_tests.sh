#!/usr/bin/env bash
# MPI integration tests: every strategy on 4 ranks with --check (final weights equal a
# single-rank reference), bad input (one clear line, the documented exit code, no hang),
# the memory plan and out-of-memory handling. Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
NP=${NP:-4}
MPIRUN=(timeout 300 mpirun -np "$NP" --oversubscribe --bind-to none)
TINY=(--model t5-tiny --batch 2 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1)

# --- every strategy trains to the single-rank reference's weights on 4 ranks ---
check_pattern='check: .* -> PASS'
T=$tmp/traces
mkdir -p "$T"
expect "ddp --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --check --out $T/ddp.h5
expect "ddp small buckets --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --bucket-mb 0.002 --check
expect "fsdp full --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding full --check --out $T/full.h5
expect "fsdp hybrid 2 --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --shard-size 2 --check --out $T/hybrid.h5
expect "fsdp none --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding none --check --out $T/none.h5
expect "fsdp grad-op --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding grad-op --check --out $T/grad-op.h5
# ZeRO-1 (optimizer-state): whole parameters and gradients, master weights and Adam sharded;
# hybrid groups, micro-batches and mixed precision; --zero-stage names the same choices.
expect "fsdp optimizer-state (ZeRO-1) --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding optimizer-state --check --out $T/zero1.h5
expect "--zero-stage 1, bf16, 2 micro-batches --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage 1 --dtype bf16 --micro-batches 2 --check --out $T/zero1-bf16.h5
expect "ZeRO-1 in groups of 2 (--shard-size 2), bf16 with fp32 reductions --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding optimizer-state --shard-size 2 --dtype bf16 --reduce-dtype fp32 \
  --check --out $T/zero1-hybrid.h5
for stage in "0 none" "2 grad-op" "3 full"; do
  set -- $stage
  expect "--zero-stage $1 is --sharding $2" 0 "strategy=fsdp-$2 " -- \
    "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage $1 --steps 1 --warmup 0
done
expect "--zero-stage and --sharding together" 2 'error: --zero-stage and --sharding name the same choice: give one of them$' -- \
  $BIN/fsdp_perf --zero-stage 1 --sharding full
expect "--zero-stage out of range" 2 'error: --zero-stage 4 is not allowed' -- $BIN/fsdp_perf --zero-stage 4
expect "ZeRO-1 accumulates whole gradients: --grad-accumulation sharded refused" 2 \
  'error: --grad-accumulation sharded is not allowed with --sharding optimizer-state' -- \
  $BIN/fsdp_perf --sharding optimizer-state --batch 2 --micro-batches 2 --grad-accumulation sharded
# CPU offload (--cpu-offload): the host's master shards, state and gradient copies, the CPU
# update, the uploads; --check with each kind and strategy it serves, and the traces (each
# unit downloaded and updated once per step, the uploads, host peak = plan: check_trace.py).
expect "--cpu-offload params (FSDP full) --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --cpu-offload params --check --out $T/offload-params.h5
expect "--cpu-offload params, hybrid 2, bf16, sgd --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --shard-size 2 --cpu-offload params --dtype bf16 \
  --optimizer sgd --check --out $T/offload-params-hybrid.h5
expect "--cpu-offload params, grad-op, FSDP2, 2 micro-batches sharded --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage 2 --cpu-offload params --fsdp-version 2 --micro-batches 2 \
  --grad-accumulation sharded --check
expect "--cpu-offload optimizer, ZeRO-2, fp32 --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage 2 --cpu-offload optimizer --check --out $T/offload-opt.h5
expect "--cpu-offload optimizer, ZeRO-1, bf16, adamw-8bit --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage 1 --cpu-offload optimizer --dtype bf16 --optimizer adamw-8bit \
  --check --out $T/offload-zero1.h5
expect "--cpu-offload optimizer, ZeRO-3, fp16 dynamic loss scale (skipped steps) --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --zero-stage 3 --cpu-offload optimizer --dtype fp16 --loss-scale dynamic \
  --loss-scale-init 1e30 --steps 3 --check
expect "--cpu-offload params where the parameters are whole" 2 \
  "error: --cpu-offload params is not allowed with --sharding optimizer-state \(allowed: full, hybrid, grad-op" -- \
  $BIN/fsdp_perf --zero-stage 1 --cpu-offload params
expect "--cpu-offload optimizer without sharded state" 2 \
  "error: --cpu-offload optimizer is not allowed with --sharding none \(allowed: optimizer-state, grad-op, full, hybrid" -- \
  $BIN/fsdp_perf --sharding none --cpu-offload optimizer
expect "--cpu-offload names its values" 2 "error: --cpu-offload 'nvme' is not allowed \(allowed: none, params, optimizer\)" -- \
  $BIN/fsdp_perf --cpu-offload nvme
expect "ddp_perf has no --cpu-offload" 2 "cpu-offload" -- $BIN/ddp_perf --cpu-offload params
expect "host out of memory: exit 3, the plan printed, the result recorded" 3 'host limit .*DOES NOT FIT' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --cpu-offload optimizer --host-mem-limit-gib 0.00001 --out $T/host-oom.h5
expect "the host out-of-memory record" 0 'out-of-memory False True' -- $PY -c "
import h5py; f = h5py.File('$T/host-oom.h5'); a = f['/'].attrs; p = f['plan'].attrs
print(a['status'].decode() if isinstance(a['status'], bytes) else a['status'], bool(p['host_fits']), bool(p['device_fits']))"
expect "fsdp full, forward prefetch, backward-post --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --forward-prefetch --prefetch backward-post --check
expect "fsdp full, no prefetch, checkpointing --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --prefetch none --activation-checkpointing --check
# Fused attention (flash-attention style, opt-in): trains to the reference, and its trace's
# measured peak equals the plan (check_trace.py below).
expect "fsdp full, fused attention --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --attention fused --check --out $T/full-fused.h5
expect "ddp bf16, fused attention, checkpointing --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --attention fused --dtype bf16 --activation-checkpointing --check \
  --out $T/ddp-fused-bf16.h5
# T5 v1.1's block (gated GELU, untied LM head) under every strategy; its traces' peaks equal
# the plan (check_trace.py below).
GATED=(--ffn gated-gelu --tie-embeddings no)
expect "ddp gated-gelu --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" "${GATED[@]}" \
  --bucket-mb 0.002 --check --out $T/ddp-gated.h5
for strat in "full" "hybrid --shard-size 2" "none" "grad-op"; do
  expect "fsdp $strat gated-gelu --check" 0 "$check_pattern" -- \
    "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" "${GATED[@]}" --sharding $strat --check
done
expect "fsdp full gated-gelu bf16, fused attention, checkpointing --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" "${GATED[@]}" --dtype bf16 --attention fused --activation-checkpointing \
  --check --out $T/full-gated-bf16.h5
expect "--ffn names what it allows" 2 "^[^ ]*fsdp_perf: error: --ffn 'swiglu' is not allowed \(allowed: relu, gated-gelu\)\$" -- \
  $BIN/fsdp_perf --ffn swiglu
expect "--tie-embeddings names what it allows" 2 "error: --tie-embeddings 'maybe' is not allowed \(allowed: yes, no\)\$" -- \
  $BIN/ddp_perf --tie-embeddings maybe
expect "--attention takes fused or unfused" 2 "attention 'flash' is not allowed .allowed: fused, unfused." -- \
  $BIN/ddp_perf --attention flash
expect "ddp checkpointing --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --activation-checkpointing --check
expect "fsdp hybrid 4 on 4 ranks (no replicas) --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --shard-size 4 --check
# Mixed precision (fp32 master weights and Adam; bf16/fp16 gathers, compute, gradients):
# the reference trains in the same precision on one rank; 16-bit rounding differs with the
# reduction order, so the default tolerance is 5e-3 (measured: 4e-4 bf16, 4e-5 fp16).
expect "ddp bf16 --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --dtype bf16 --check --out $T/ddp-bf16.h5
expect "fsdp full bf16 --check" 0 "$check_pattern" -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --dtype bf16 --check --out $T/full-bf16.h5
expect "fsdp hybrid 2 bf16, fp32 reductions --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --shard-size 2 --dtype bf16 --reduce-dtype fp32 --check
expect "fsdp none fp16 (dynamic loss scale) --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding none --dtype fp16 --check
expect "ddp fp16 gradients reduced in fp32 --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --dtype fp16 --reduce-dtype fp32 --bucket-mb 0.002 --check
expect "an fp16 overflow under a static loss scale (1e30) is a failed run, exit 4" 4 'error: the loss is not finite from step [0-9]+ on' -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --dtype fp16 --loss-scale 1e30 --out $T/overflow.h5
expect "the overflowed run is recorded as failed" 0 'failed [1-9]' -- \
  $PY -c "import h5py; a = h5py.File('$T/overflow.h5')['/'].attrs; print(a['status'], a['first_nonfinite_step'])"
# Dynamic loss scaling (GradScaler): an overflowing scale skips the update on every rank
# alike and halves; the single-rank reference skips the same steps.
expect "dynamic loss scale: inf/NaN gradients skip the update and halve the scale" 0 \
  'inf/NaN gradients at loss scale 1e\+30: update skipped, loss scale now 5e\+29' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --dtype fp16 --loss-scale dynamic --loss-scale-init 1e30 --check \
  --out $T/skip.h5
expect "skipped updates are recorded per step and in total" 0 'ok 3 3 1.25e\+29' -- $PY -c "
import h5py
f = h5py.File('$T/skip.h5'); a = f['/'].attrs; s = f['steps'][()]
print(a['status'].decode() if isinstance(a['status'], bytes) else a['status'], a['skipped_steps'],
      int(s['skipped'][s['rank'] == 0].sum()), '%g' % a['final_loss_scale'])"
expect "dynamic loss scale doubling every step, then backing off: --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --steps 8 --dtype fp16 --loss-scale-growth-interval 1 --check
expect "bf16 --check fails below the bf16 rounding error" 4 'check: .* -> FAIL' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --dtype bf16 --check --check-tolerance 1e-6
expect "the bf16 trace records its precisions" 0 "bf16 bf16 1.0" -- \
  $PY -c "import h5py; a = h5py.File('$T/full-bf16.h5')['/'].attrs; print(a['dtype'], a['reduce_dtype'], a['loss_scale'])"
# The check can fail: 4-rank sums are not bit-identical to one rank's, so a tolerance
# below the rounding error must be reported as a mismatch with exit code 4.
expect "--check detects a difference above its tolerance" 4 'check: .* -> FAIL' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --check --check-tolerance 1e-30
# The check is right by construction (docs/reliability.md): the README's example on
# t5-small, and every strategy on 8 ranks for 10 steps, pass with the derived bound.
expect "README: t5-small hybrid 2 on 4 ranks --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf --model t5-small --sharding hybrid --shard-size 2 --check
MPI8=(timeout 300 mpirun -np 8 --oversubscribe --bind-to none)
TINY10=(--model t5-tiny --batch 1 --seq-len 12 --dec-seq-len 8 --steps 9 --warmup 1)
for strat in "ddp_perf" "fsdp_perf --sharding full" "fsdp_perf --sharding hybrid --shard-size 2" \
  "fsdp_perf --sharding hybrid --shard-size 4 --dtype bf16" "fsdp_perf --sharding none" \
  "fsdp_perf --sharding grad-op --forward-prefetch" "fsdp_perf --sharding optimizer-state --dtype bf16"; do
  expect "8 ranks, 10 steps: $strat --check" 0 "$check_pattern" -- "${MPI8[@]}" $BIN/$strat "${TINY10[@]}" --check
done
# Injected faults (SHARDBENCH_INJECT_FAULT, test only) are caught at the step they happen.
for fault in "drop-grad-shard fsdp_perf --sharding full" "drop-grad-shard ddp_perf" \
  "wrong-reduction-scale fsdp_perf --sharding hybrid --shard-size 2" "wrong-reduction-scale ddp_perf" \
  "stale-prefetch fsdp_perf --sharding full" "zero1-skip-param-gather fsdp_perf --sharding optimizer-state" \
  "offload-skip-upload fsdp_perf --cpu-offload params" "offload-skip-upload fsdp_perf --zero-stage 1 --cpu-offload optimizer"; do
  set -- $fault
  name=$1
  shift
  expect "injected fault $name ($*): --check fails" 4 'check: first failure: step [12]: ' -- \
    env SHARDBENCH_INJECT_FAULT=$name "${MPIRUN[@]}" -x SHARDBENCH_INJECT_FAULT $BIN/"$@" "${TINY[@]}" --check
done

# --- --optimizer: each optimizer passes --check (the reference runs it with its own state)
# under DDP and FSDP, fp32 and bf16, and its run's measured peak equals its plan ---
for opt in adamw-8bit sgd; do
  expect "ddp --optimizer $opt --check" 0 "check: .* $opt updates .* -> PASS" -- \
    "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --optimizer $opt --weight-decay 0.01 --check --out $T/ddp-$opt.h5
  expect "fsdp full bf16 --optimizer $opt --check" 0 "$check_pattern" -- \
    "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer $opt --weight-decay 0.01 --dtype bf16 --check --out $T/full-bf16-$opt.h5
  expect "fsdp hybrid 2 --optimizer $opt --check" 0 "$check_pattern" -- \
    "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer $opt --sharding hybrid --shard-size 2 --check --out $T/hybrid-$opt.h5
  expect "fsdp grad-op --optimizer $opt --check" 0 "$check_pattern" -- \
    "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer $opt --sharding grad-op --check
done
expect "ddp bf16 --optimizer adamw-8bit --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --optimizer adamw-8bit --dtype bf16 --check
expect "fsdp full --optimizer adamw --weight-decay 0.1 --check" 0 "check: .* adamw updates .* -> PASS" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer adamw --weight-decay 0.1 --check --out $T/full-adamw-wd.h5
expect "fsdp full --optimizer sgd --momentum 0 --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer sgd --momentum 0 --check
expect "fsdp full --tp 2 --optimizer sgd --check" 0 "check: .* sgd updates .* -> PASS" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --tp 2 --optimizer sgd --weight-decay 0.01 --check
expect "fsdp full --pp 2 --optimizer adamw-8bit --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --pp 2 --optimizer adamw-8bit --check
expect "ddp --tp 2 --optimizer adamw-8bit runs (--check is refused with it)" 0 "^RESULT .*strategy=ddp-tp2" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --tp 2 --optimizer adamw-8bit
expect "fsdp full --optimizer adamw-8bit --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer adamw-8bit --check --out $T/full-8bit.h5
expect "traces of each optimizer: measured peak = plan (python check)" 0 '^ok .*full-8bit.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/ddp-adamw-8bit.h5 $T/ddp-sgd.h5 $T/full-bf16-adamw-8bit.h5 \
  $T/full-bf16-sgd.h5 $T/hybrid-adamw-8bit.h5 $T/hybrid-sgd.h5 $T/full-adamw-wd.h5 $T/full-8bit.h5
expect "the plan names the optimizer and its state (8-bit: 2 bytes + 8 per 256)" 0 \
  'optimizer_state +18.79 KiB +18.79 KiB +16.00 KiB' -- \
  $BIN/fsdp_perf "${TINY[@]}" --optimizer adamw-8bit --plan --world-size 4
# --- HDF5 results, checked from Python against docs/trace-format.md ---
expect "traces of every strategy (python check)" 0 '^ok .*none.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/ddp.h5 $T/full.h5 $T/hybrid.h5 $T/none.h5 $T/grad-op.h5 $T/ddp-bf16.h5 $T/full-bf16.h5 \
  $T/full-fused.h5 $T/ddp-fused-bf16.h5 $T/ddp-gated.h5 $T/full-gated-bf16.h5 $T/zero1.h5 $T/zero1-bf16.h5 $T/zero1-hybrid.h5 \
  $T/offload-params.h5 $T/offload-params-hybrid.h5 $T/offload-opt.h5 $T/offload-zero1.h5
expect "summarize.py: one row per run" 0 'fsdp-hybrid2 +t5-tiny +4 .* ok' -- $PY $ROOT/analysis/summarize.py $T/*.h5
env SHARDBENCH_INJECT_FAULT=zero1-skip-param-gather "${MPIRUN[@]}" -x SHARDBENCH_INJECT_FAULT $BIN/fsdp_perf "${TINY[@]}" \
  --sharding optimizer-state --out $T/zero1-no-gather.h5 >/dev/null 2>&1
expect "the python check refuses a ZeRO-1 trace without its all-gathers" 1 'ZeRO-1 all-gathers are not each unit once' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/zero1-no-gather.h5
expect "the python check fails on a wrong rank count" 1 'FAIL' -- $PY $ROOT/tests/check_trace.py --ranks 2 --steps 3 $T/ddp.h5
expect "out-of-memory run writes its status and plan" 3 'wrote .*oom.h5 \(status out-of-memory\)' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --mem-limit-gib 0.000001 --out $T/oom.h5
expect "out-of-memory record (python check)" 0 '^ok ' -- $PY $ROOT/tests/check_trace.py --ranks 4 --oom $T/oom.h5
expect "the final line names the file" 0 "wrote $T/named.h5 \([0-9.]+ [KM]?i?B in [0-9.]+ s\)\$" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --out $T/named.h5
expect "existing --out without --overwrite" 2 "--out '$T/named.h5' exists \(pass --overwrite" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --out $T/named.h5
expect "missing directory" 2 "directory '$T/nope/' does not exist" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --out $T/nope/x.h5
expect "--out is a directory" 2 "is a directory" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --out $T
expect "bad input writes no file" 2 "--batch 0" -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --batch 0 --out $T/bad.h5
if [ -e $T/bad.h5 ] || ls $T/bad.h5.*tmp >/dev/null 2>&1 || [ -e $T/nope ]; then echo "file left" >"$tmp/out"; bad "no file after bad input"; else ok "no file after bad input"; fi
# A run killed mid-way leaves nothing under the final name.
timeout -s KILL 3 mpirun -np 2 --oversubscribe --bind-to none $BIN/fsdp_perf --model t5-small --batch 2 --seq-len 64 --steps 1000 \
  --out $T/killed.h5 >"$tmp/out" 2>&1
if [ -e $T/killed.h5 ]; then bad "killed run leaves no result"; else ok "killed run leaves no result"; fi
pkill -9 -f "fsdp_perf --model t5-small --batch 2 --seq-len 64 --steps 1000" 2>/dev/null || true

# Two runs with the same --out: both pass the start-up check, both hold their result under
# a temporary of their own until publishing (delayed here so they overlap: 10 s, so that a
# busy machine starting the second mpirun late still has them overlap); exactly one takes
# the name, the other exits 6 naming the suffixed file that keeps its result.
MPI2=(timeout 300 mpirun -np 2 --oversubscribe --bind-to none -x SHARDBENCH_INJECT_FAULT)
for w in 1 2; do
  SHARDBENCH_INJECT_FAULT=publish-delay=10 "${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --out $T/race.h5 >"$tmp/race$w" 2>&1 &
done
rc1=0 rc2=0
wait %1 || rc1=$?
wait %2 || rc2=$?
cat "$tmp/race1" "$tmp/race2" >"$tmp/out"
codes=$(echo $rc1 $rc2 | tr ' ' '\n' | sort | tr '\n' ' ')
if [ "$codes" = "0 6 " ] && grep -q "was written by another run while this one ran: this result is kept as '$T/race-2.h5'" "$tmp/out"; then
  ok "two writers racing for one --out: one publishes, the other exits 6 and keeps race-2.h5"
else
  echo "exit codes: $codes" >>"$tmp/out"; bad "two writers racing for one --out: one publishes, the other exits 6 and keeps race-2.h5"
fi
expect "both racing results are complete" 0 'ok ok' -- $PY -c "
import h5py
print(*(h5py.File(p)['/'].attrs['status'] for p in ('$T/race.h5', '$T/race-2.h5')))"
if ls $T/race*.tmp >/dev/null 2>&1; then bad "racing writers leave no temporary"; else ok "racing writers leave no temporary"; fi

# --- a full disk and SIGTERM during the write leave nothing behind, and say why ---
D=$tmp/small
mkdir -p $D
if mount -t tmpfs -o size=512k tmpfs $D 2>/dev/null; then
  expect "full disk: the cause, the path and the bytes needed, exit 1" 1 \
    "No space left on device: '$D/' has [0-9]+ bytes free, the result $D/x.h5 needs about [0-9]+ bytes; nothing was written" -- \
    "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --out $D/x.h5
  expect "full disk: collective_perf the same" 1 "No space left on device: '$D/' has" -- \
    "${MPIRUN[@]}" $BIN/collective_perf -b 1K -e 1K -n 2 -w 1 --out $D/c.h5
  if [ -n "$(ls -A $D)" ]; then ls -la $D >"$tmp/out"; bad "full disk leaves no file"; else ok "full disk leaves no file"; fi
  # --schedule-json on a full disk: the cause named, nothing under its name, no temporary.
  fallocate -l $(( $(stat -f -c '%a*%S' $D) )) $D/filler 2>/dev/null || true
  expect "--schedule-json on a full disk: the cause, exit 1" 1 \
    "error: --schedule-json '$D/s.json' cannot be written: No space left on device.*; nothing was written$" -- \
    $BIN/fsdp_perf --model t5-tiny --plan --schedule-json $D/s.json
  rm -f $D/filler
  if [ -n "$(ls -A $D)" ]; then ls -la $D >"$tmp/out"; bad "--schedule-json on a full disk leaves no file"
  else ok "--schedule-json on a full disk leaves no file"; fi
  # The disk fills after the space check passed, while the collective write runs: the job
  # names the cause and ends (no rank waits in the collective), and the temporary goes.
  umount $D && mount -t tmpfs -o size=8m tmpfs $D
  ( for i in $(seq 300); do ls $D/*.tmp >/dev/null 2>&1 && break; sleep 0.1; done
    fallocate -l $(( $(stat -f -c '%a*%S' $D) )) $D/filler 2>/dev/null || true ) &
  filler=$!
  # (Open MPI 4.1's OMPIO reports success for the refused writes: the read-back catches it.)
  expect "disk filling during the collective write: the cause, exit 1, nothing published" 1 \
    "(failed \(HDF5\)|does not read back).*: No space left on device: '$D/' has 0 bytes free" -- \
    env SHARDBENCH_INJECT_FAULT=write-delay=1 "${MPIRUN[@]}" -x SHARDBENCH_INJECT_FAULT $BIN/ddp_perf "${TINY[@]}" --out $D/y.h5
  wait $filler
  rm -f $D/filler
  if [ -n "$(ls -A $D)" ]; then ls -la $D >"$tmp/out"; bad "disk filled during the write: no file left"; else ok "disk filled during the write: no file left"; fi
  umount $D
else
  echo "skip  full disk: mounting a small tmpfs is not allowed here (needs root or CAP_SYS_ADMIN)"
fi
# SIGTERM (scancel, a time limit) while the result is being written: the temporary goes too.
# The publish is held back (test hook) so that the signal arrives with the temporary open.
SHARDBENCH_INJECT_FAULT=publish-delay=60 mpirun -np 2 --oversubscribe --bind-to none -x SHARDBENCH_INJECT_FAULT \
  $BIN/ddp_perf "${TINY[@]}" --out $T/term.h5 >"$tmp/out" 2>&1 &
pid=$!
for i in $(seq 600); do ls $T/term.h5.*.tmp >/dev/null 2>&1 && break; sleep 0.1; done
if ls $T/term.h5.*.tmp >/dev/null 2>&1; then
  kill -TERM $pid
  wait $pid
  if ls $T/term.h5* >/dev/null 2>&1; then ls -la $T >>"$tmp/out"; bad "SIGTERM during the write leaves no file"; else ok "SIGTERM during the write leaves no file"; fi
else
  kill -KILL $pid 2>/dev/null; wait $pid; bad "SIGTERM during the write: the run never reached the write"
fi

# A stopped rank (SIGSTOP) must not hang the job: the watchdog (--timeout-s) ends it with a
# line naming the rank, step and pending operation, and rank 0 records the run as failed.
# A run of NP ranks (--timeout-s 3, result OUT.h5) whose rank RANK is stopped (SIGSTOP) once
# steps are printed; sets stopped (its pid, empty if never stopped) and rc (mpirun's exit).
run_with_stopped_rank() {  # NP NAME RANK [FAULT]: FAULT for SHARDBENCH_INJECT_FAULT on every rank
  local np=$1 name=$2 rank=$3 pid p i
  SHARDBENCH_INJECT_FAULT=${4:-} timeout 120 mpirun -np $np --oversubscribe --bind-to none -x SHARDBENCH_INJECT_FAULT \
    $BIN/ddp_perf "${TINY[@]}" --steps 1000000 --timeout-s 3 --out $T/$name.h5 >"$tmp/out" 2>&1 &
  pid=$!
  stopped=
  for i in $(seq 100); do
    for p in $(pgrep -f "ddp_perf .*$T/$name.h5"); do
      if grep -qz "^OMPI_COMM_WORLD_RANK=$rank$" /proc/$p/environ 2>/dev/null && grep -q '^[0-9]*/' "$tmp/out"; then
        kill -STOP $p && stopped=$p
      fi
    done
    [ -n "$stopped" ] && break
    sleep 0.2
  done
  wait $pid
  rc=$?
}
run_with_stopped_rank 2 stuck 1
if [ -n "$stopped" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  grep -qE "watchdog: .* rank 0: no progress for [0-9]+ s in step [0-9]+ \(pending: .+\); ending the job" "$tmp/out"; then
  ok "a stopped rank: the watchdog ends the job, naming rank, step and pending operation"
else
  echo "exit $rc, stopped pid '${stopped}'" >>"$tmp/out"; bad "a stopped rank: the watchdog ends the job, naming rank, step and pending operation"
fi
expect "the stopped run is recorded as failed" 0 'failed watchdog: .* rank 0: no progress' -- $PY -c "
import h5py
a = h5py.File('$T/stuck.h5')['/'].attrs
print(a['status'], a['failure'])"

# Rank 0 stopped (SIGSTOP) on 4 ranks: its watchdog cannot act, so a surviving rank's ends
# the job and records the run as failed, once however many of them time out. The writer
# holds the record 2 s (record-delay): the other watchdogs fire meanwhile and must wait for
# it, as their exit makes mpirun end every rank, the writer too.
run_with_stopped_rank 4 stuck0 0 record-delay=2
[ -n "$stopped" ] && kill -KILL $stopped 2>/dev/null
if [ -n "$stopped" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
  grep -qE "watchdog: .* rank [123]: no progress for [0-9]+ s in step [0-9]+ \(pending: .+\); ending the job" "$tmp/out"; then
  ok "rank 0 stopped: another rank's watchdog ends the job"
else
  echo "exit $rc, stopped pid '${stopped}'" >>"$tmp/out"; bad "rank 0 stopped: another rank's watchdog ends the job"
fi
expect "rank 0 stopped: the run is recorded as failed by a surviving rank" 0 'failed watchdog: .* rank [123]: no progress' -- $PY -c "
import h5py
a = h5py.File('$T/stuck0.h5')['/'].attrs
print(a['status'], a['failure'])"
if [ ! -e $T/stuck0.h5 ] || ls $T/stuck0-*.h5 $T/stuck0.h5.*tmp >/dev/null 2>&1; then ls -la $T >"$tmp/out"; bad "rank 0 stopped: one record, no temporary left"
else ok "rank 0 stopped: one record, no temporary left"; fi

# --- the run prints its table, step lines and a summary ---
expect "step lines and summary" 0 'harness overhead' -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}"
expect "configuration table" 0 '\| parameters +\| [0-9,]+' -- "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}"

# --- bad input: one line naming the value, exit 2, every rank exits ---
expect "unknown model" 2 "--model 't5-nope' is not allowed \(allowed: t5-611m" -- "${MPIRUN[@]}" $BIN/fsdp_perf --model t5-nope
expect "unknown sharding" 2 "--sharding 'zero9' is not allowed" -- "${MPIRUN[@]}" $BIN/fsdp_perf --sharding zero9
expect "shard size not dividing world" 2 "--shard-size 3 is not allowed with world size 4" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --shard-size 3
expect "hybrid without shard size: one node's ranks" 0 "strategy=fsdp-hybrid4 " -- "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid
expect "hybrid without shard size in a plan" 2 "needs --shard-size G where there are no nodes" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding hybrid --plan --world-size 8
expect "unknown dtype" 2 "--dtype 'fp8' is not allowed \(allowed: fp32, bf16, fp16\)" -- "${MPIRUN[@]}" $BIN/fsdp_perf --dtype fp8
expect "non-positive loss scale" 2 "--loss-scale '0' is not allowed \(a finite number > 0 and <= 3.4e\+38, or dynamic\)" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf --dtype fp16 --loss-scale 0
expect "initial scale without dynamic scaling" 2 "--loss-scale-init is only allowed with --loss-scale dynamic" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf --dtype fp16 --loss-scale 8 --loss-scale-init 1024
expect "zero batch" 2 "--batch 0 is not allowed \(an integer from 1 to 2147483647\)" -- "${MPIRUN[@]}" $BIN/ddp_perf --batch 0
expect "negative steps" 2 "--steps -3 is not allowed" -- "${MPIRUN[@]}" $BIN/ddp_perf --steps -3
expect "zero seq-len" 2 "--seq-len 0 is not allowed" -- "${MPIRUN[@]}" $BIN/fsdp_perf --seq-len 0
expect "unknown flag" 2 "--frobnicate" -- "${MPIRUN[@]}" $BIN/ddp_perf --frobnicate
expect "unparsable number" 2 "error: .*batch" -- "${MPIRUN[@]}" $BIN/ddp_perf --batch many
expect "ddp has no --sharding" 2 "sharding" -- "${MPIRUN[@]}" $BIN/ddp_perf --sharding full
# One parsing layer for every numeric flag: no integer wraps, no inf/nan gets through.
for bad in "--steps 4294967298|--steps 4294967298 is not allowed \(an integer from 1 to 2147483647\)" \
  "--steps 99999999999|--steps 99999999999 is not allowed" "--warmup -1|--warmup -1 is not allowed \(an integer from 0" \
  "--mem-limit-gib inf|--mem-limit-gib inf is not allowed \(a finite number > 0 and <= 1048576\)" \
  "--mem-limit-gib 1e10|--mem-limit-gib 1e10 is not allowed" "--mem-limit-gib nan|--mem-limit-gib nan is not allowed" \
  "--lr inf|--lr inf is not allowed \(a finite number > 0" "--lr nan|--lr nan is not allowed" \
  "--seed -1|--seed -1 is not allowed" "--bucket-mb inf|--bucket-mb inf is not allowed" \
  "--steps 2.5|--steps 2.5 is not allowed" "--loss-scale-init inf --loss-scale dynamic|--loss-scale-init inf is not allowed" \
  "--d-ff abc|--d-ff abc is not allowed \(an integer from 1 to 2147483647\)\$"; do
  expect "numeric flag: ${bad%%|*}" 2 "^[^ ]*ddp_perf: error: ${bad#*|}" -- "${MPIRUN[@]}" $BIN/ddp_perf ${bad%%|*}
done
expect "numeric flag: --fsdp-version abc" 2 "^[^ ]*fsdp_perf: error: --fsdp-version abc is not allowed \(an integer from 1 to 2\)\$" -- \
  $BIN/fsdp_perf --fsdp-version abc
for bad in "--min-busbw nan|--min-busbw nan is not allowed \(a finite number >= 0" "-n 99999999999|-n 99999999999 is not allowed" \
  "-f inf|-f inf is not allowed" "-a 4|-a 4 is not allowed \(an integer from 0 to 3\)" \
  "-f 1|-f 1 is not allowed \(a finite number > 1 and <= 1000000\)\$" "-f 1.0|-f 1.0 is not allowed \(a finite number > 1" \
  "-g abc|-g abc is not allowed \(an integer from 1 to 2147483647\)\$" "-t x|-t x is not allowed \(an integer from 1" \
  "-x y|-x y is not allowed \(an integer from -1" "-V 1.5|-V 1.5 is not allowed \(an integer from 1"; do
  expect "collective_perf numeric flag: ${bad%%|*}" 2 "${bad#*|}" -- "${MPIRUN[@]}" $BIN/collective_perf ${bad%%|*}
done
# A sweep in which no size holds an element measures nothing: refused, not recorded as ok.
expect "collective_perf: no usable size (-b 3 -e 3 -d float) is refused" 2 \
  "-b 3 -e 3: no size in the sweep is large enough for all-reduce of float on 4 ranks \(the smallest is 4 B\)" -- \
  "${MPIRUN[@]}" $BIN/collective_perf -b 3 -e 3 -d float --out $T/three.h5
if [ -e $T/three.h5 ]; then bad "no file for a sweep that measures nothing"; else ok "no file for a sweep that measures nothing"; fi
# collective_perf plans its buffers and refuses what does not fit, before allocating.
expect "collective_perf: buffers beyond memory are refused, exit 3" 3 \
  'status: out-of-memory: -e 4398046511104 needs 8.00 TiB per rank .*nothing was allocated' -- \
  "${MPIRUN[@]}" $BIN/collective_perf -b 4096G -e 4096G --out $T/huge.h5
if [ -e $T/huge.h5 ]; then bad "no file for a refused collective_perf"; else ok "no file for a refused collective_perf"; fi
expect "SHARDBENCH_MIN_BUSBW=nan is refused too" 2 "SHARDBENCH_MIN_BUSBW nan is not allowed" -- \
  env SHARDBENCH_MIN_BUSBW=nan "${MPIRUN[@]}" -x SHARDBENCH_MIN_BUSBW $BIN/collective_perf
expect "an exact integer in exponent form is an integer" 0 'seq len enc / dec +\| 1000 / 1000' -- \
  $BIN/fsdp_perf --model t5-tiny --seq-len 1e3 --plan
expect "unknown backend" 2 "--backend 'tpu' is not allowed \(allowed: cpu, cuda\)" -- "${MPIRUN[@]}" $BIN/ddp_perf --backend tpu

# --- memory plan and out-of-memory ---
expect "memory limit too small: out-of-memory, exit 3" 3 'status: out-of-memory' -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --mem-limit-gib 0.000001
expect "plan: t5-11.3b DDP does not fit 80 GiB on 8 ranks" 3 'DOES NOT FIT' -- \
  timeout 120 $BIN/ddp_perf --model t5-11.3b --batch 8 --seq-len 512 --activation-checkpointing \
  --plan --world-size 8 --mem-limit-gib 80
expect "plan: t5-11.3b FSDP full fits 80 GiB on 8 ranks" 0 '-> fits' -- \
  timeout 120 $BIN/fsdp_perf --model t5-11.3b --batch 8 --seq-len 512 --activation-checkpointing \
  --plan --world-size 8 --mem-limit-gib 80
expect "plan: hybrid on 512 ranks" 0 'world 512, shard group 8' -- \
  timeout 120 $BIN/fsdp_perf --model t5-11.3b --batch 8 --seq-len 512 --activation-checkpointing \
  --sharding hybrid --shard-size 8 --plan --world-size 512 --mem-limit-gib 80
expect "plan with --out records out-of-memory for 512 ranks" 3 'wrote .*plan-oom.h5' -- \
  timeout 120 $BIN/ddp_perf --model t5-11.3b --batch 8 --seq-len 512 --plan --world-size 512 \
  --mem-limit-gib 80 --out $T/plan-oom.h5
expect "planned out-of-memory record (python check)" 0 '^ok ' -- $PY $ROOT/tests/check_trace.py --ranks 512 --oom $T/plan-oom.h5
expect "plan with --out that fits writes nothing" 0 '-> fits' -- \
  timeout 120 $BIN/fsdp_perf --model t5-tiny --plan --world-size 8 --out $T/plan-fits.h5
if [ -e $T/plan-fits.h5 ]; then bad "no file for a plan that fits"; else ok "no file for a plan that fits"; fi
# The plan allocates nothing that grows with the shapes: seconds and a fixed footprint
# for any sequence length (it used to build a T x T host table: bad_alloc at 1e6).
expect "plan at seq 1e6: the plan, exit 3, in seconds" 3 'DOES NOT FIT' -- \
  timeout 60 $BIN/fsdp_perf --model t5-tiny --seq-len 1000000 --plan
# /usr/bin/time (Debian's `time`, which make deps installs) reports the high-water mark.
/usr/bin/time -f 'maxrss_kb %M' timeout 60 $BIN/fsdp_perf --model t5-tiny --batch 1 --seq-len 100000000 --plan \
  >"$tmp/out" 2>&1
rss=$(sed -n 's/^maxrss_kb //p' "$tmp/out")
if grep -q 'DOES NOT FIT' "$tmp/out" && [ "${rss:-99999999}" -lt 1048576 ]; then
  ok "plan at seq 1e8: under 1 GiB resident (${rss} KiB)"
else bad "plan at seq 1e8: under 1 GiB resident (${rss:-?} KiB)"; fi
expect "tokens per rank beyond a GEMM's int rows" 2 '--batch 2 x --seq-len 2147483647 = 4294967294 tokens per rank is not allowed' -- \
  $BIN/fsdp_perf --model t5-tiny --batch 2 --seq-len 2147483647 --plan
expect "--world-size only with --plan" 2 'only allowed with --plan' -- $BIN/fsdp_perf --world-size 8

# --- the CUDA backend's MPI path on host memory (no GPU needed): chunks through the slot ring,
# every collective, sub-communicators; 3 ranks (odd) and 4 ---
for np in 3 4; do
  expect "MPI staging pipeline on $np ranks (test_mpi_stager)" 0 'PASSED' -- \
    timeout 300 mpirun -np $np --oversubscribe --bind-to none $BIN/test_mpi_stager --gtest_brief=1
done
# --- the opt-in compute paths (docs/gpu.md): fused epilogues train to the reference; the
# CUDA default is unfused attention; the kernel and graph flags refuse what they cannot do ---
expect "fsdp full, fused epilogues, fused attention bf16 --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/fsdp_perf "${TINY[@]}" --fused-epilogues --attention fused --dtype bf16 --check
expect "ddp fused epilogues, checkpointing --check" 0 "$check_pattern" -- \
  "${MPIRUN[@]}" $BIN/ddp_perf "${TINY[@]}" --fused-epilogues --activation-checkpointing --check
expect "--backend cuda plans unfused attention by default" 0 '\| attention +\| unfused ' -- \
  $BIN/fsdp_perf --backend cuda --model t5-tiny --plan
expect "--attention-kernel names its values" 2 "--attention-kernel 'wgmma' is not allowed .allowed: auto, fma, mma." -- \
  $BIN/fsdp_perf --backend cuda --attention fused --attention-kernel wgmma --plan
expect "--attention-kernel only with fused attention on cuda" 2 \
  '--attention-kernel is only allowed with --backend cuda --attention fused' -- \
  $BIN/fsdp_perf --backend cuda --attention-kernel fma --plan
expect "--attention-kernel mma not in fp32" 2 '--attention-kernel mma is not allowed with --dtype fp32' -- \
  $BIN/fsdp_perf --backend cuda --attention fused --attention-kernel mma --plan
expect "--cuda-graphs only with --backend cuda" 2 '--cuda-graphs is only allowed with --backend cuda' -- \
  $BIN/ddp_perf --cuda-graphs --plan
# The CUDA backend is a plugin (src/backend/cuda_plugin.cpp): the programs do not link cuBLAS
# (0.4 s of every process start), --backend cuda loads it from ../lib, and a missing plugin is
# one line naming the file.
if [ -e "$ROOT/build/lib/libshardbench_cuda.so" ]; then
  check "the programs do not link cuBLAS, NCCL or the CUDA runtime" bash -c "! ldd $BIN/fsdp_perf $BIN/ddp_perf \
    $BIN/collective_perf $BIN/kernel_bench | grep -E 'libcublas|libnccl|libcudart'"
  expect "--backend cuda loads the plugin: past it, the GPU is what is missing here" 1 'no CUDA device visible' -- \
    $BIN/fsdp_perf --backend cuda --model t5-tiny --batch 2 --seq-len 8 --steps 1 --warmup 0 --out $tmp/cuda.h5
  check "... and no result file" test ! -e $tmp/cuda.h5
  mkdir -p $tmp/alone/bin && cp $BIN/ddp_perf $tmp/alone/bin/
  expect "a program without the plugin beside it: one line naming the file, exit 1" 1 \
    "--backend cuda: cannot load the CUDA backend $tmp/alone/bin/../lib/libshardbench_cuda.so: .*No such file" -- \
    $tmp/alone/bin/ddp_perf --backend cuda --model t5-tiny --batch 2 --seq-len 8 --steps 1 --warmup 0 --out $tmp/alone.h5
  check "... and CPU runs of it need no plugin" $tmp/alone/bin/ddp_perf --model t5-tiny --batch 2 --seq-len 8 \
    --steps 1 --warmup 0 --out $tmp/alone.h5
fi
# gpu-check in parts: --help needs no GPU; a bad part is a usage error; without a GPU a part
# stops at once with the reason.
expect "gpu-check --help lists the parts" 0 'hf +scripts/hf-compare.sh' -- bash $ROOT/scripts/gpu-check.sh --help
expect "gpu-check refuses an unknown part" 2 "unknown part 'gemm' .allowed: tests perf mpi correctness sanitize attention hf." -- \
  bash $ROOT/scripts/gpu-check.sh tests gemm
if ! command -v nvidia-smi >/dev/null; then
  expect "gpu-check without a GPU says so" 1 'no GPU visible' -- bash $ROOT/scripts/gpu-check.sh tests
fi
expect "--comm only with --backend cuda" 2 'only allowed with --backend cuda' -- $BIN/fsdp_perf --model t5-tiny --comm mpi --plan
expect "--comm names its values" 2 "allowed: nccl, mpi, mpi-staged, mpi-direct" -- \
  $BIN/fsdp_perf --model t5-tiny --backend cuda --comm gloo --plan

summary
