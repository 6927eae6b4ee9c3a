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

# --- a small set of results: measured runs, an out-of-memory record, projected points ---
"${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --out $R/ddp.h5 >"$tmp/out" 2>&1 || bad "ddp run"
"${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --out $R/full.h5 >"$tmp/out" 2>&1 || bad "fsdp run"
$BIN/ddp_perf --model t5-11.3b --batch 8 --seq-len 512 --plan --world-size 8 --mem-limit-gib 80 --out $R/ddp-11b.h5 \
  >"$tmp/out" 2>&1
expect "projection over the A100 description (uncalibrated), t5-611m and t5-11.3b" 0 't5-11.3b +ddp .* out-of-memory' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/a100-80gb.toml --model t5-611m --model t5-11.3b \
  --strategies ddp,fsdp-full,fsdp-hybrid --gpus 8,64 --batch 8 --seq 512 --activation-checkpointing --out $R/projected
expect "projection: hybrid beats full sharding at 64 GPUs of t5-11.3b" 0 'ok' -- $PY - $R/projected <<'PYEOF'
import sys, h5py, os
d = sys.argv[1]
t = lambda n: h5py.File(os.path.join(d, n))["/"].attrs["median_step_time_s"]
assert t("t5-11.3b-fsdp-hybrid8-g64-b8-s512.h5") < t("t5-11.3b-fsdp-full-g64-b8-s512.h5")
print("ok")
PYEOF
expect "report: figures and HTML from the folder" 0 'report: .*index.html \(4 figures' -- \
  $PY $ROOT/analysis/report.py $R --out $tmp/report
for f in tflops_vs_model tflops_vs_gpus memory timeline; do
  check "report: $f.png is a PNG and $f.svg exists" \
    bash -c "head -c 8 $tmp/report/$f.png | od -An -c | grep -q 'P   N   G' && test -s $tmp/report/$f.svg"
  check "report: index.html shows $f" grep -q "src=\"$f.png\"" $tmp/report/index.html
done
check "report: the run table lists measured, projected and out-of-memory runs" \
  bash -c "grep -q 'measured' $tmp/report/index.html && grep -q 'projected' $tmp/report/index.html && grep -q 'out-of-memory' $tmp/report/index.html"
check "report: provenance of the measured runs" grep -q 'shardbench' $tmp/report/index.html

# --- bad input ---
mkdir -p $tmp/empty $tmp/mixed
cp $R/ddp.h5 $tmp/mixed/
$PY -c "import h5py; f = h5py.File('$tmp/mixed/v1.h5', 'w'); f.attrs['schema_version'] = 1" 2>/dev/null
expect "report: an empty folder" 2 'no .h5 results' -- $PY $ROOT/analysis/report.py $tmp/empty
expect "report: a mixed-schema folder" 2 'schema' -- $PY $ROOT/analysis/report.py $tmp/mixed
expect "projection without calibration data when required" 2 'no calibration data' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/local-cpu.toml --model t5-tiny --gpus 2 --batch 2 \
  --seq 16 --require-calibration --out $tmp/p1
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
