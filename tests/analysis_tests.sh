#!/usr/bin/env bash
# Analysis: the study's figures and the HTML report from a small set of results, the
# projection (schedule replay) against measured local runs within a stated error, and bad
# input (empty or mixed folders, no calibration, an incomplete cluster description).
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
R=$tmp/results
mkdir -p $R
TINY=(--model t5-tiny --batch 2 --seq-len 16 --steps 2 --warmup 1)
MPI2=(timeout 300 mpirun -np 2 --bind-to none)
MPI4=(timeout 300 mpirun -np 4 --bind-to none)

# --- a small set of results: measured runs, an out-of-memory record, projected points ---
"${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --out $R/ddp.h5 >"$tmp/out" 2>&1 || bad "ddp run"
"${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --out $R/full.h5 >"$tmp/out" 2>&1 || bad "fsdp run"
$BIN/ddp_perf --model t5-11.3b --batch 8 --seq-len 512 --plan --world-size 8 --mem-limit-gib 80 --out $R/ddp-11b.h5 \
  >"$tmp/out" 2>&1
expect "projection over the A100 description, t5-611m and t5-11.3b" 0 't5-11.3b +ddp .* out-of-memory' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/a100-80gb.toml --model t5-611m --model t5-11.3b \
  --strategies ddp,fsdp-full,fsdp-hybrid --gpus 8,512 --batch 8 --seq-len 512 --activation-checkpointing \
  --out $R/projected
expect "projection: hybrid beats full sharding of t5-611m at 512 GPUs (docs/projection.md)" 0 'ok' -- \
  $PY - $R/projected <<'PYEOF'
import sys, h5py, os
d = sys.argv[1]
t = lambda n: h5py.File(os.path.join(d, n))["/"].attrs["median_step_time_s"]
assert t("t5-611m-fsdp-hybrid8-g512-b8-s512.h5") < t("t5-611m-fsdp-full-g512-b8-s512.h5")
print("ok")
PYEOF
expect "report: figures and HTML from the folder" 0 'report: .*index.html \(4 figures' -- \
  $PY $ROOT/analysis/report.py $R --out $tmp/report
for f in tflops_vs_model tflops_vs_gpus memory comparison timeline-ddp timeline-full; do
  check "report: $f.png is a PNG and $f.svg exists" \
    bash -c "head -c 8 $tmp/report/$f.png | od -An -c | grep -q 'P   N   G' && test -s $tmp/report/$f.svg"
  check "report: index.html shows $f" grep -q "src=\"$f.png\"" $tmp/report/index.html
done
check "report: each timeline links its Perfetto trace, which parses" bash -c "grep -q 'href=\"full.trace.json\"' \
  $tmp/report/index.html && $PY -c 'import json, sys; assert json.load(open(sys.argv[1]))[\"traceEvents\"]' \
  $tmp/report/full.trace.json"
check "report: warnings of the runs (here: too few timed steps)" grep -q 'only 2 timed step(s)' $tmp/report/index.html
check "report: labels say CPU rank, never GPU, for CPU runs" \
  bash -c "grep -q '<td>CPU rank</td>' $tmp/report/index.html && ! grep -q 'TFLOPS/GPU' $tmp/report/index.html"
check "report: the run table lists measured, projected and out-of-memory runs" \
  bash -c "grep -q 'measured' $tmp/report/index.html && grep -q 'projected' $tmp/report/index.html && grep -q 'out-of-memory' $tmp/report/index.html"
check "report: provenance of the measured runs" grep -q 'shardbench' $tmp/report/index.html

# --- one command-line convention: every analysis script's --help documents every argument ---
expect "analysis scripts: --help exits 0, whole descriptions, every argument documented" 0 \
  'analysis scripts follow the convention' -- $PY $ROOT/tests/check_cli.py

# --- Perfetto / chrome://tracing timelines: slices = HDF5 events per rank and lane, ordered;
# a real 4-rank result (the demo's model and size) prints its conversion time ---
"${MPI4[@]}" $BIN/fsdp_perf --model t5-small --batch 2 --seq-len 64 --steps 2 --warmup 1 \
  --sharding hybrid --shard-size 2 --out $tmp/small4.h5 >"$tmp/out" 2>&1 || bad "fsdp t5-small 4-rank run"
expect "to_perfetto: JSON per result matches its events, memory and warm-up steps" 0 'converted in' -- \
  $PY $ROOT/tests/check_perfetto.py $tmp/small4.h5 $R/ddp.h5 $R/full.h5 $R/projected/t5-611m-fsdp-hybrid8-g64-b8-s512.h5
sed -n 's/^ok    small4.h5/      to_perfetto: small4.h5/p' "$tmp/out"

# --- bad input ---
mkdir -p $tmp/empty $tmp/mixed
cp $R/ddp.h5 $tmp/mixed/
$PY -c "import h5py; f = h5py.File('$tmp/mixed/v1.h5', 'w'); f.attrs['schema_version'] = 1" 2>/dev/null
expect "report: an empty folder" 2 'no .h5 results' -- $PY $ROOT/analysis/report.py $tmp/empty
expect "report: a mixed-schema folder" 2 'schema' -- $PY $ROOT/analysis/report.py $tmp/mixed
expect "projection without calibration data when required" 2 'no calibration data' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/local-cpu.toml --model t5-tiny --gpus 2 --batch 2 \
  --seq-len 16 --require-calibration --out $tmp/p1
grep -v '^latency_us' $ROOT/runs/clusters/h100-80gb.toml | sed '/^\[inter\]/,$!b' >$tmp/broken.toml
expect "cluster description missing a field" 2 "missing field '(intra|inter).latency_us'" -- \
  $PY $ROOT/analysis/project.py --cluster $tmp/broken.toml --model t5-tiny --gpus 2 --out $tmp/p2
expect "projection: unknown strategy" 2 "unknown strategy 'zero4'" -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/h100-80gb.toml --model t5-tiny --strategies zero4 \
  --gpus 2 --out $tmp/p3

# --- the projection reproduces measured local runs (docs/projection.md states the error) ---
expect "projection within ${PROJECTION_MAX_ERROR:=0.5} of measured 2-rank runs (calibrated)" 0 'worst \|error\|' -- \
  env RANKS=2 STEPS=3 bash $ROOT/scripts/validate-projection.sh $tmp/val "$PROJECTION_MAX_ERROR"

summary
