#!/usr/bin/env bash
# Pipeline parallelism (--pp, GPipe and 1F1B) on the layout with data and tensor parallelism:
# --check against a micro-batched single-rank reference, the sends per step read from the
# trace against 2 M (S - 1) plus the split's extra tensors, each send's peer and bytes, every
# send paired with its receive, each stage's actions in its schedule's order, each stage's
# activations as many micro-batches' as its schedule holds, each stage's plan equal to its
# measured peak, the measured bubble beside (S - 1) / (M + S - 1), and bad values refused in
# one line (exit 2). Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
MPI2=(timeout 300 mpirun -np 2 --oversubscribe --bind-to none)
MPI4=(timeout 300 mpirun -np 4 --oversubscribe --bind-to none)
TINY=(--model t5-tiny --batch 4 --seq-len 12 --dec-seq-len 8 --steps 2 --warmup 1)
check_pattern='check: .* -> PASS'
T=$tmp/traces
mkdir -p "$T"

# --- pp 2 and pp 4, both schedules; 1F1B with M < S - 1 (pp 4, M 2: a warm-up of
# min(S - s - 1, M) forwards); pp 2 x dp 2 with DDP and FSDP full; pp 2 x tp 2 ---
runs=(
  "pp2-1f1b|${MPI2[*]}|fsdp_perf --sharding none --pp 2 --micro-batches 4 --pp-schedule 1f1b"
  "pp2-gpipe|${MPI2[*]}|fsdp_perf --sharding none --pp 2 --micro-batches 4 --pp-schedule gpipe"
  "pp4-1f1b|${MPI4[*]}|fsdp_perf --sharding none --pp 4 --pp-schedule 1f1b"
  "pp4-gpipe|${MPI4[*]}|fsdp_perf --sharding none --pp 4 --micro-batches 4 --pp-schedule gpipe"
  "pp4-1f1b-m2|${MPI4[*]}|fsdp_perf --sharding none --pp 4 --batch 2 --micro-batches 2 --pp-schedule 1f1b"
  "pp4-gpipe-bf16|${MPI4[*]}|fsdp_perf --sharding none --pp 4 --micro-batches 2 --pp-schedule gpipe --dtype bf16"
  "pp2-dp2-ddp|${MPI4[*]}|ddp_perf --pp 2"
  "pp2-dp2-full-bf16|${MPI4[*]}|fsdp_perf --sharding full --pp 2 --dtype bf16"
  "pp2-tp2|${MPI4[*]}|fsdp_perf --sharding full --pp 2 --tp 2"
  "pp2-dp2-zero1-m2|${MPI4[*]}|fsdp_perf --zero-stage 1 --pp 2 --batch 4 --micro-batches 2"
  "pp2-dp2-zero1-bf16|${MPI4[*]}|fsdp_perf --sharding optimizer-state --pp 2 --dtype bf16"
  "pp2-dp2-offload-params-m2|${MPI4[*]}|fsdp_perf --sharding full --pp 2 --cpu-offload params --batch 4 --micro-batches 2"
  "pp2-dp2-zero1-offload-bf16|${MPI4[*]}|fsdp_perf --zero-stage 1 --pp 2 --cpu-offload optimizer --dtype bf16"
  "pp2-split1-fused-ckpt|${MPI2[*]}|ddp_perf --pp 2 --pp-split 1 --attention fused --activation-checkpointing"
)
for r in "${runs[@]}"; do
  IFS='|' read -r name launcher cmd <<<"$r"
  read -r -a launch <<<"$launcher"
  read -r program flags <<<"$cmd"
  read -r -a flag_list <<<"$flags"
  expect "$name --check" 0 "$check_pattern" -- "${launch[@]}" $BIN/$program "${TINY[@]}" "${flag_list[@]}" --check \
    --out $T/$name.h5
done

# --- each stage holds what its pieces use: the embedding on the stages that look tokens up
# (the first, the bridge's: where the decoder starts) and, tied, the last; the bridge's
# encoder.final_norm with the bridge; the head (decoder.final_norm, an untied lm_head) on the
# last. --check on 4 ranks, untied (T5 v1.1's block, small shapes) and tied (t5-tiny), DDP
# and FSDP full, with the decoder starting on the last stage and earlier: pp 2 --pp-split 1
# and pp 4 --pp-split 3 (last), pp 2 with a long decoder (the bridge on stage 0, balanced)
# and pp 4 --pp-split 2 (earlier); the embedding's copies summed over its holders only ---
UNTIED=(--model t5-v1_1-small --d-model 64 --d-ff 128 --heads 4 --d-kv 16 --vocab 256 --batch 4 --steps 2 --warmup 1)
TIED=(--model t5-tiny --batch 4 --steps 2 --warmup 1)
placements=(
  "pp2-last|--layers 2 --seq-len 12 --dec-seq-len 8 --pp 2 --pp-split 1"
  "pp2-earlier|--layers 2 --seq-len 4 --dec-seq-len 16 --pp 2"
  "pp4-last|--layers 4 --seq-len 12 --dec-seq-len 8 --pp 4 --pp-split 3"
  "pp4-earlier|--layers 2 --seq-len 12 --dec-seq-len 8 --pp 4 --pp-split 2"
)
for model in untied tied; do
  if [ $model = untied ]; then shape=("${UNTIED[@]}"); else shape=("${TIED[@]}"); fi
  for x in "${placements[@]}"; do
    IFS='|' read -r where flags <<<"$x"
    read -r -a flag_list <<<"$flags"
    for program in "ddp_perf" "fsdp_perf --sharding full"; do
      read -r -a prog <<<"$program"
      expect "$model $where ${prog[0]} --check (the embedding on its stages)" 0 "$check_pattern" -- \
        "${MPI4[@]}" $BIN/"${prog[@]}" "${shape[@]}" "${flag_list[@]}" --check --out $T/units-$model-$where-${prog[0]}.h5
    done
  done
done
# The traces of those runs: the stages' parameters are the model's plus one embedding per
# further stage holding it, the units named (tests/check_trace.py).
expect "the stages' parameters in the traces: the model's plus the embedding's copies" 0 '^ok .*units-tied-pp4-earlier-fsdp_perf.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/units-untied-pp2-last-ddp_perf.h5 \
  $T/units-untied-pp2-earlier-fsdp_perf.h5 $T/units-tied-pp2-earlier-ddp_perf.h5 $T/units-tied-pp4-last-fsdp_perf.h5 \
  $T/units-tied-pp4-earlier-fsdp_perf.h5

# The plan of every stage (--schedule-json): each stage's units are those its pieces use
# (the embedding where the encoder embedding, the bridge or a tied head runs; the head unit
# on the last stage only), its parameters their sum, and the stages' parameters the model's
# plus exactly the embedding's further copies (a tensor-parallel rank's parts under --tp).
plan_units() {  # plan_units JSON FLAGS...: fsdp_perf's plan with FLAGS as JSON, its stages' units checked
  local json=$1
  shift
  $BIN/fsdp_perf "$@" --schedule-json "$json" >/dev/null || return 1
  $PY -c "
import json, sys
j = json.load(open(sys.argv[1]))
L, S, stages, tp = j['layers'], j['pp_size'], j['stages'], j['tp_size']
params = [x['params'] for x in stages]
# The stages that look tokens up (the encoder embedding's, the bridge's) or, tied, project
# onto the embedding (the head's): a copy of the embedding (a tensor-parallel rank's rows) each.
def uses(x):
    pieces = range(x['first_piece'], x['last_piece'])
    return 0 in pieces or L + 1 in pieces or bool(j['tie_embeddings'] and 2 * L + 2 in pieces)
holders = [s for s, x in enumerate(stages) if uses(x)]
embedding = j['vocab'] * j['d_model'] // tp
model = j['param_count'] if tp == 1 else sum(j['unit_params'])  # a tensor-parallel rank's part
assert sum(params) == model + (len(holders) - 1) * embedding, \\
    f'stages {params}: {sum(params) - model} parameters beyond the model, not {len(holders) - 1} embedding copies'
# Each stage's units: those its pieces use, its parameters their sum; the head on the last.
names, sizes = j['unit_names'], j['unit_params']
e, head = names.index('embedding'), names.index('head')
for s, x in enumerate(stages):
    units = x['units']
    assert (e in units) == (s in holders), f'stage {s}: units {units}'
    assert (head in units) == (s == S - 1), f'stage {s} and the head (lm_head, decoder.final_norm)'
    assert params[s] == sum(sizes[u] for u in units), f'stage {s}: {params[s]} parameters, units {units}'
print('ok', params, 'embedding on', holders, 'head', sizes[head])" "$json"
}
# The issue's command as written: without --micro-batches the default --batch 2 takes 2 (the
# largest count up to --pp that divides it; it used to be refused).
XL=(--model flan-t5-xl --pp 4 --plan --world-size 8)
expect "flan-t5-xl --pp 4: no lm_head on stage 0, no shared on the last stage (the decoder starts on stage 1)" 0 \
  '^ok \[741139456, 743240704, 715196416, 715978752\] embedding on \[0, 1\] head 65800192$' -- \
  plan_units $tmp/xl.json "${XL[@]}"
expect "flan-t5-xl --pp 4 --pp-split 2: the last stage without shared" 0 'embedding on \[0, 2\] head 65800192$' -- \
  plan_units $tmp/xl2.json "${XL[@]}" --pp-split 2
expect "flan-t5-xl --pp 4 --pp-split 3: the decoder's first stage, the last, looks its tokens up" 0 \
  'embedding on \[0, 3\]' -- \
  plan_units $tmp/xl3.json "${XL[@]}" --pp-split 3
expect "t5-2.28b --pp 4 --tp 2 (tied): the last stage's LM head is the embedding, a tensor-parallel rank's rows" 0 \
  'embedding on \[0, 1, 3\] head 2048$' -- \
  plan_units $tmp/tied.json --model t5-2.28b --pp 4 --tp 2 --micro-batches 2 --plan --world-size 16
expect "the plan names the embedding's stages" 0 \
  '^  the embedding \(65,798,144 parameters\) on stages 0, 1: a copy on each, its gradient summed over them$' -- \
  $BIN/fsdp_perf "${XL[@]}"
expect "the plan names the head's stage: lm_head on the last stage alone" 0 \
  '^  the head \(decoder\.final_norm, lm_head: 65,800,192 parameters\) on stage 3 alone$' -- \
  $BIN/fsdp_perf "${XL[@]}"
expect "the plan of a tied model: the head's LM head is the embedding" 0 \
  '^  the head \(decoder\.final_norm: 1,024 parameters\) on stage 1 alone, its LM head the embedding$' -- \
  $BIN/fsdp_perf --model t5-611m --pp 2 --plan --world-size 2

# One micro-batch alone (--batch 1 --micro-batches 1, the micro-batch of the M-micro-batch
# runs above): its activations, per stage, are what each micro-batch in flight holds.
check "one micro-batch on 2 stages (the activations' unit)" "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding none \
  --pp 2 --batch 1 --micro-batches 1 --steps 1 --warmup 0 --out $T/one-pp2.h5
check "one micro-batch on 4 stages (the activations' unit)" "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding none \
  --pp 4 --batch 1 --micro-batches 1 --steps 1 --warmup 0 --out $T/one-pp4.h5

# The traces: plan = measured peak on every stage, each stage's GEMM FLOPs as planned, every
# send to a neighbouring stage, 2 M (S - 1) sends per step and pipeline plus the encoder
# output's and position-bias tables' (tests/check_trace.py, check_pipeline), each rank's
# sends and receives of the peers and bytes of the cut's tensors (check_transfers), every
# send paired with its receive (check_pairs), each stage's actions in the schedule's order
# (check_order).
expect "2-rank pipeline traces (python check)" 0 '^ok .*pp2-gpipe.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 2 --steps 3 $T/pp2-1f1b.h5 $T/pp2-gpipe.h5 $T/pp2-split1-fused-ckpt.h5
expect "4-rank pipeline traces (python check)" 0 '^ok .*pp2-tp2.h5' -- \
  $PY $ROOT/tests/check_trace.py --ranks 4 --steps 3 $T/pp4-1f1b.h5 $T/pp4-gpipe.h5 $T/pp4-1f1b-m2.h5 \
  $T/pp4-gpipe-bf16.h5 $T/pp2-dp2-ddp.h5 $T/pp2-dp2-full-bf16.h5 $T/pp2-tp2.h5 $T/pp2-dp2-zero1-m2.h5 \
  $T/pp2-dp2-zero1-bf16.h5 $T/pp2-dp2-offload-params-m2.h5 $T/pp2-dp2-zero1-offload-bf16.h5

# Activations per stage (/memory_peaks) = the micro-batches the stage holds x one
# micro-batch's (the one-micro-batch run's same stage), exactly: GPipe M on every stage,
# 1F1B min(S - s, M) on stage s (tests/pipeline_checks.py activations). On 4 stages with
# M = 4 every stage differs; a schedule holding one micro-batch more or less on any stage is
# off by a whole micro-batch's bytes.
for x in "pp2-gpipe|2|4, 4" "pp2-1f1b|2|2, 1" "pp4-gpipe|4|4, 4, 4, 4" "pp4-1f1b|4|4, 3, 2, 1" "pp4-1f1b-m2|4|2, 2, 2, 1"; do
  IFS='|' read -r name S held <<<"$x"
  case $name in
    *gpipe*) sched=gpipe what="GPipe holds M micro-batches' activations on every stage" ;;
    *) sched=1f1b what="1F1B holds min(S - s, M) micro-batches' activations on stage s" ;;
  esac
  expect "$what: $name, [$held] x one micro-batch's (exact)" 0 \
    "^ok .*/$name.h5: $sched S $S M [0-9]+: peak activations per stage \[[0-9, ]+\] = held \[$held\] x one" -- \
    $PY $ROOT/tests/pipeline_checks.py activations --one-micro-batch $T/one-pp$S.h5 $T/$name.h5
done

# Each rank's sends and receives, in issue order: forward to the next stage's rank (the same
# data- and tensor-parallel coordinates), backward to the previous one, each of the cut's
# tensors once per micro-batch, of its bytes (tests/pipeline_checks.py transfers). pp 4,
# M 4, t5-tiny (d_model 32, 2 heads, 32 buckets), fp32: the hidden state 1 x 12 x 32 x 4 B =
# 1536 (decoder 1 x 8 x 32 x 4 = 1024), the encoder output 1536, a position-bias table
# 32 x 2 x 4 = 256, and its gradient the same 256 (each stage folds its blocks' d(bias)
# into the table's gradient before the cut; it used to send d(bias), 2 x 12 x 12 x 4 = 1152).
expect "the sends name their peers (s + 1 forward, s - 1 backward), carry the cut's bytes, and count 2 M (S - 1) plus the split's extra tensors" 0 \
  'sends 48 .*0->1 forward 4 x \[1536, 256\]; 1->2 forward 4 x \[1536\]; 1->0 backward 4 x \[1536, 256\]; 2->3 forward 4 x \[1024, 1536, 256\]; 2->1 backward 4 x \[1536\]; 3->2 backward 4 x \[1024, 1536, 256\]$' -- \
  $PY $ROOT/tests/pipeline_checks.py transfers $T/pp4-1f1b.h5
expect "every pipeline trace's sends and receives: peers and bytes (bf16, dp, tp, fused)" 0 \
  '^ok .*pp2-tp2.h5: step 3: sends 8 \(2 pipeline\(s\) .*0->2 forward 2 x \[3072\]; 2->0 backward 2 x \[3072\]$' -- \
  $PY $ROOT/tests/pipeline_checks.py transfers $T/pp2-1f1b.h5 $T/pp2-gpipe.h5 $T/pp4-gpipe.h5 $T/pp4-1f1b-m2.h5 \
  $T/pp4-gpipe-bf16.h5 $T/pp2-dp2-ddp.h5 $T/pp2-dp2-full-bf16.h5 $T/pp2-split1-fused-ckpt.h5 $T/pp2-tp2.h5

# Across stages: per step, the k-th send of rank a to rank b with the k-th receive on b from
# a, the same bytes, completing after the send started (one clock offset per pair of ranks:
# each rank's times start at its own reading after a barrier) (tests/pipeline_checks.py pairs).
expect "every send pairs with one receive: same step, order and bytes, received after sent (2 and 4 stages, both schedules, dp, pp x tp)" 0 \
  '^ok .*pp2-tp2.h5: 24 sends paired with 24 receives' -- \
  $PY $ROOT/tests/pipeline_checks.py pairs $T/pp2-1f1b.h5 $T/pp2-gpipe.h5 $T/pp4-1f1b.h5 $T/pp4-gpipe.h5 \
  $T/pp4-1f1b-m2.h5 $T/pp4-gpipe-bf16.h5 $T/pp2-dp2-ddp.h5 $T/pp2-dp2-full-bf16.h5 $T/pp2-split1-fused-ckpt.h5 \
  $T/pp2-tp2.h5

# The schedule as run: each stage's forwards (F) and backwards (B) in the order of its
# compute lane's GEMMs (tests/pipeline_checks.py order). 1F1B with M 2 < S - 1 = 3 (it
# passed --check above): stage s warms up with min(S - s - 1, M) forwards, then alternates.
expect "1F1B with M < S - 1 (pp 4, M 2): each stage runs min(S - s - 1, M) forwards first, then 1F1B's order" 0 \
  '^ok .*pp4-1f1b-m2.h5: 1f1b S 4 M 2: stage 0 FFBB, stage 1 FFBB, stage 2 FFBB, stage 3 FBFB; warm-up forwards \[2, 2, 1, 0\]' -- \
  $PY $ROOT/tests/pipeline_checks.py order $T/pp4-1f1b-m2.h5
expect "1F1B and GPipe orders on 4 stages, M 4" 0 \
  '^ok .*pp4-gpipe.h5: gpipe S 4 M 4: stage 0 FFFFBBBB, stage 1 FFFFBBBB, stage 2 FFFFBBBB, stage 3 FFFFBBBB;' -- \
  bash -c "$PY $ROOT/tests/pipeline_checks.py order $T/pp4-1f1b.h5 $T/pp4-gpipe.h5 && $PY $ROOT/tests/pipeline_checks.py order $T/pp4-1f1b.h5 | grep -q 'stage 0 FFFFBBBB, stage 1 FFFBFBBB, stage 2 FFBFBFBB, stage 3 FBFBFBFB; warm-up forwards \[3, 2, 1, 0\]'"

# The bubble's accounting, not its size: how idle a pipeline measures depends on what else
# the machine runs (29.8 % for 20 % in theory on a busy one), so the figure itself belongs
# in docs/performance.md, and its fill-drain shape to the projection's tests. Here: the
# recorded idle_share is exactly the median over timed steps of 1 - (mean busy time of the
# ranks) / (slowest rank's step time), from the run's own /steps rows; the theory attribute
# is (S - 1) / (M + S - 1); and a 2-stage pipeline does idle (each stage waits at least
# for the other's first micro-batch).
"${MPI2[@]}" $BIN/fsdp_perf --model t5-small --sharding none --pp 2 --pp-split 1 --micro-batches 4 --batch 16 \
  --seq-len 64 --dec-seq-len 20 --steps 4 --warmup 1 --out $T/bubble.h5 --overwrite >"$tmp/out" 2>&1
expect "the bubble's accounting: idle_share from /steps, theory (S-1)/(M+S-1) = 20%, a 2-stage pipeline idles" 0 \
  '^ok idle_share' -- $PY -c "
import h5py, numpy as np
f = h5py.File('$T/bubble.h5'); a = f['/'].attrs; st = f['steps'][()]
st = st[~st['warmup'].astype(bool)]
idle = [1 - st['compute'][st['step'] == s].mean() / st['time'][st['step'] == s].max() for s in np.unique(st['step'])]
want = float(np.median(idle))
assert abs(a['idle_share'] - want) < 1e-9, (a['idle_share'], want)
assert abs(a['pipeline_bubble_theory'] - 0.2) < 1e-12, a['pipeline_bubble_theory']
assert 0 < a['idle_share'] < 1, a['idle_share']
print('ok idle_share', a['idle_share'], '= median of', np.round(idle, 4), 'theory', a['pipeline_bubble_theory'])"

# The report shows the measured bubble beside the theory.
mkdir -p $tmp/rep && cp $T/bubble.h5 $tmp/rep/
expect "report: the measured bubble beside (S-1)/(M+S-1)" 0 'bubble [0-9.]+ % measured, 20.0 % in theory' -- \
  bash -c "$PY $ROOT/analysis/report.py $tmp/rep --timelines 0 >/dev/null && sed 's/<li>/\n/g' $tmp/rep/report/index.html"

# The projection replays every stage: its HDF5 holds each stage's first rank's events, with
# the activations' sends and receives on lane 4, their gradients' on lane 5 (as the CUDA
# backend's streams), and Perfetto's JSON draws them.
expect "projection of a pipeline: every stage's events, sends and receives" 0 '^ok ranks \[0, 4\] sends [1-9]' -- \
  bash -c "$PY $ROOT/analysis/project.py --bin $BIN --cluster $ROOT/runs/clusters/a100-80gb.toml --model t5-2.28b --layers 4 \
    --strategies ddp-tp2-pp2 --gpus 8 --batch 4 --micro-batches 4 --out $tmp/proj >/dev/null && $PY -c \"
import h5py, numpy as np
f = h5py.File('$tmp/proj/t5-2.28b-layers4-ddp-tp2-pp2-g8-b4-s512.h5'); e = f['events'][()]
names = list(f['events'].attrs['op_names'])
sends = e[e['op'] == names.index('send')]
forward = list(f['events'].attrs['phase_names']).index('forward')
assert set(sends[sends['phase'] == forward]['lane']) == {4} and set(sends[sends['phase'] != forward]['lane']) == {5}
assert len(e[e['op'] == names.index('recv')]) == len(sends)
assert abs(f.attrs['pipeline_bubble_theory'] - 1 / 5) < 1e-12 and 0 < f.attrs['idle_share'] < 1
print('ok ranks', sorted(set(int(r) for r in e['rank'])), 'sends', len(sends))\" && \
    $PY $ROOT/analysis/to_perfetto.py $tmp/proj/t5-2.28b-layers4-ddp-tp2-pp2-g8-b4-s512.h5 -o $tmp/proj/t.json >/dev/null"

# --- the plan of every stage, any world, nothing allocated ---
expect "--plan --world-size 64 --pp 4 --tp 8: one line per stage" 0 '^  stage 3: decoder block [0-9]+ \.\. head' -- \
  $BIN/fsdp_perf --model t5-11.3b --batch 8 --seq-len 512 --dtype bf16 --activation-checkpointing --tp 8 --pp 4 \
  --plan --world-size 64 --mem-limit-gib 80

# --- FSDP over micro-batches: unsharded gradients held to the last (PyTorch's no_sync,
# the default), or reduce-scattered after every micro-batch (--grad-accumulation sharded) ---
for args in "--sharding full" "--sharding hybrid --shard-size 2 --dtype bf16" "--sharding none" \
            "--sharding full --pp 2 --fsdp-version 2"; do
  expect "--grad-accumulation sharded, $args, M 4: --check" 0 "$check_pattern" -- \
    "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" $args --micro-batches 4 --grad-accumulation sharded --check \
    --out "$T/ga-$(echo "$args" | tr -c 'a-z0-9\n-' '_').h5"
done
"${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --sharding full --micro-batches 4 --out $T/ga-held.h5 >/dev/null 2>&1
expect "sharded accumulation reduce-scatters every unit once per micro-batch, held accumulation once per step" 0 \
  '^ok per step: held [0-9]+ sharded [0-9]+ = 4 x' -- $PY -c "
import h5py
def per_step(p):
    f = h5py.File(p); e = f['events'][()]
    names = [x.decode() if isinstance(x, bytes) else x for x in f['events'].attrs['op_names']]
    rs = e[(e['op'] == names.index('reduce-scatter')) & (e['step'] == 2) & (e['rank'] == 0)]
    assert f.attrs['grad_accumulation'] in (b'sharded', 'sharded', b'unsharded', 'unsharded')
    return len(rs), len(set(rs['unit']))
held, units = per_step('$T/ga-held.h5')
sharded, units2 = per_step('$T/ga---sharding_full.h5')
assert held == units == units2 and sharded == 4 * held, (held, sharded, units)
print('ok per step: held', held, 'sharded', sharded, '= 4 x', units, 'units')"
expect "the plan: sharded accumulation holds one unit's unsharded gradient, held accumulation every unit's" 0 \
  '^ok comm buffers' -- bash -c "
    plan() { $BIN/fsdp_perf --model t5-small --plan --world-size 8 --batch 8 --micro-batches \$1 --grad-accumulation \$2 |
             sed -n 's/^  comm_buffers *\([0-9.]*\) \([KMG]\)iB.*/\1 \2/p'; }
    $PY - \"\$(plan 1 unsharded)\" \"\$(plan 4 unsharded)\" \"\$(plan 4 sharded)\" <<'PY'
import sys
b = lambda s: float(s.split()[0]) * {'K': 2**10, 'M': 2**20, 'G': 2**30}[s.split()[1]]
one, held, sharded = map(b, sys.argv[1:])
assert held > 1.5 * one and sharded < 1.1 * one, (one, held, sharded)
print(f'ok comm buffers M 1 {one / 2**20:.1f} MiB; M 4 held {held / 2**20:.1f} MiB, sharded {sharded / 2**20:.1f} MiB')
PY"
expect "--grad-accumulation takes unsharded or sharded" 2 "--grad-accumulation 'eager' is not allowed \(allowed: unsharded, sharded\)" -- \
  $BIN/fsdp_perf --grad-accumulation eager --plan

# --- bad values: one line, exit 2, nothing written ---
expect "--pp not dividing the world" 2 '--pp 3 is not allowed with world size 4 \(must divide it' -- \
  "${MPI4[@]}" $BIN/fsdp_perf "${TINY[@]}" --pp 3 --micro-batches 1 --out $T/bad.h5
expect "more stages than blocks" 2 'error: --pp 6 is not allowed with 4 blocks \(2 encoder \+ 2 decoder; at most one stage per block\)' -- \
  $BIN/fsdp_perf --model t5-tiny --batch 6 --pp 6 --plan --world-size 6
expect "--micro-batches not dividing the batch" 2 'error: --micro-batches 3 is not allowed with --batch 4 \(must divide it\)' -- \
  $BIN/fsdp_perf "${TINY[@]}" --pp 2 --micro-batches 3 --plan --world-size 2
expect "--pp-split out of range" 2 '--pp-split 2 is not allowed with --pp 2' -- \
  $BIN/fsdp_perf "${TINY[@]}" --pp 2 --pp-split 2 --plan --world-size 2
expect "--pp-schedule takes gpipe or 1f1b" 2 "--pp-schedule 'interleaved' is not allowed \(allowed: gpipe, 1f1b\)" -- \
  $BIN/fsdp_perf --pp-schedule interleaved
if [ -e $T/bad.h5 ] || ls $T/bad.h5.*tmp >/dev/null 2>&1; then
  echo "file left" >"$tmp/out"; bad "no file after bad --pp input"
else ok "no file after bad --pp input"; fi

summary
