#!/usr/bin/env bash
# Analysis: the study's figures and the HTML report from a small set of results, the
# projection (schedule replay) against measured local runs within a stated error, and bad
# input (empty or mixed folders, no calibration, an incomplete cluster description), and
# unreadable files (truncated, foreign, crashing the HDF5 library) skipped by every tool.
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
# A shape no preset has, measured and projected (the programs' shape flags): labelled by its
# shape, never by a bare 'preset*'; a bad shape value is refused in one line, exit 2.
"${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --layers 1 --ffn gated-gelu --tie-embeddings no --out $R/gated.h5 \
  >"$tmp/out" 2>&1 || bad "fsdp run of a gated shape"
expect "projection with shape overrides (--layers --ffn --tie-embeddings)" 0 \
  '^t5-11.3b-layers4-ffn-gated-gelu-tie-no +fsdp-full +8 +8 .* ok$' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/a100-80gb.toml --model t5-11.3b --layers 4 \
  --ffn gated-gelu --tie-embeddings no --strategies fsdp-full --gpus 8 --batch 8 --seq-len 512 --out $R/projected
expect "the projected point records its shape" 0 '^t5-11.3b\* 4 gated-gelu 0 [0-9]+$' -- $PY -c "
import h5py; a = h5py.File('$R/projected/t5-11.3b-layers4-ffn-gated-gelu-tie-no-fsdp-full-g8-b8-s512.h5')['/'].attrs
print(a['model'], a['layers'], a['ffn'], a['tie_embeddings'], a['param_count'])"
for bad in "--d-ff 0|--d-ff 0 is not allowed \(an integer from 1 to 2147483647\)" \
  "--heads abc|--heads abc is not allowed \(an integer from 1 to 2147483647\)" \
  "--ffn swiglu|--ffn 'swiglu' is not allowed \(allowed: relu, gated-gelu\)" \
  "--tie-embeddings maybe|--tie-embeddings 'maybe' is not allowed \(allowed: yes, no\)" \
  "--batch 8,x|--batch '8,x' is not a comma-separated list of integers" \
  "--batch 8,0|--batch '8,0': every value must be positive"; do
  expect "projection refuses ${bad%%|*} in one line, exit 2" 2 "^project: error: ${bad#*|}\$" -- \
    $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/a100-80gb.toml --model t5-11.3b ${bad%%|*} \
    --strategies fsdp-full --gpus 8 --out $tmp/pbad
  check "... nothing else on stderr, nothing written" bash -c "[ \$($PY $ROOT/analysis/project.py --cluster \
    $ROOT/runs/clusters/a100-80gb.toml --model t5-11.3b ${bad%%|*} --gpus 8 --out $tmp/pbad 2>&1 >/dev/null | wc -l) = 1 ] \
    && [ ! -e $tmp/pbad ]"
done
# --matrix: a run matrix's points (per-entry shapes included), named as slurm/sweep names them.
sed 's/^models = .*/models = ["t5-tiny", {model = "t5-tiny", layers = 1, ffn = "gated-gelu"}]/' \
  $ROOT/runs/local.toml >$tmp/matrix.toml
expect "projection of a run matrix (--matrix)" 0 '^t5-tiny-layers1-ffn-gated-gelu +fsdp-hybrid2 +4 +2 .* ok$' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/local-cpu.toml --matrix $tmp/matrix.toml --out $tmp/pm
expect "... one result per point of the sweep, under the sweep's names" 0 '^ok 8$' -- $PY -c "
import importlib.machinery, importlib.util, os
loader = importlib.machinery.SourceFileLoader('sweep', '$ROOT/slurm/sweep')
sweep = importlib.util.module_from_spec(importlib.util.spec_from_loader('sweep', loader)); loader.exec_module(sweep)
want = {p.name + '.h5' for p in sweep.points(sweep.load_matrix('$tmp/matrix.toml', {}))}
assert sorted(os.listdir('$tmp/pm')) == sorted(want), (sorted(os.listdir('$tmp/pm')), sorted(want))
print('ok', len(want))"
expect "--matrix of another precision than the cluster's rates is refused" 2 \
  "^project: error: .*\[matrix\] dtype fp32 is not the cluster description's bf16" -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/a100-80gb.toml --matrix $tmp/matrix.toml --out $tmp/pm2
# summarize: ranks sorted as numbers (8 before 512), each row's source named, '-' where an
# out-of-memory record has no time.
$PY $ROOT/analysis/summarize.py $R/projected/t5-611m-fsdp-full-g512-b8-s512.h5 \
  $R/projected/t5-611m-fsdp-full-g8-b8-s512.h5 $R/ddp-11b.h5 $R/ddp.h5 >$tmp/sum.txt 2>&1
check "summarize: 8 GPUs before 512 (numeric order), the projected rows marked projected" bash -c "
  grep -E '^fsdp_perf +fsdp-full +t5-611m +8 .* projected +ok\$' $tmp/sum.txt | grep -q . &&
  [ \$(grep -nE '^fsdp_perf +fsdp-full +t5-611m +8 ' $tmp/sum.txt | cut -d: -f1) -lt \
    \$(grep -nE '^fsdp_perf +fsdp-full +t5-611m +512 ' $tmp/sum.txt | cut -d: -f1) ]"
check "summarize: a measured run marked run, an out-of-memory record's times '-'" bash -c "
  grep -qE '^ddp_perf +ddp +t5-tiny +2 .* run +ok\$' $tmp/sum.txt &&
  grep -qE '^ddp_perf +ddp +t5-11.3b +8 +8 +512 +- +- +[0-9.]+ +run +out-of-memory\$' $tmp/sum.txt &&
  ! grep -q nan $tmp/sum.txt"
expect "report: figures and HTML from the folder" 0 'report: .*index.html \(4 figures' -- \
  $PY $ROOT/analysis/report.py $R --out $tmp/report
expect "report: runs without a pipeline show no bubble ('–'), each its share not computing" 0 '^ok [0-9]+ rows$' -- \
  $PY - $tmp/report/index.html <<'PYEOF'
import re, sys
html = open(sys.argv[1]).read()
table = html[html.index("<h2>Runs</h2>"):]
head = re.findall(r"<th>(.*?)</th>", table)
rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(<td>.*?)</tr>", table)]
b, i = head.index("pipeline bubble (theory)"), head.index("not computing")
assert rows and all(r[b] == "–" for r in rows), [r[b] for r in rows]
assert any(r[i].endswith(" %") for r in rows), [r[i] for r in rows]
print("ok", len(rows), "rows")
PYEOF
check "report: overridden shapes are labelled by their shape, never as preset*" bash -c "\
  grep -q '<td>T5 1+1 layers, d_model 32, d_ff 64, 2x8 heads, vocab 96, gated-GELU, untied head</td>' $tmp/report/index.html \
  && grep -q '<td>T5 4+4 layers, d_model 1024, d_ff 65536, 128x128 heads, vocab 32128, gated-GELU, untied head</td>' \
  $tmp/report/index.html && ! grep -q 't5-tiny\*\|t5-11.3b\*' $tmp/report/index.html"
# No title, axis label or legend of any figure reaches past the image's edge: this folder
# (several panels) and one model measured alone (one narrow panel, as make demo's report).
mkdir -p $tmp/alone && cp $R/ddp.h5 $R/full.h5 $tmp/alone/
for folder in $R $tmp/alone; do
  expect "report: no figure's text is cut at its edge ($(basename $folder))" 0 '^uncut [0-9]+$' -- $PY -c "
import sys; sys.path.insert(0, '$ROOT/analysis')
import plots, report
assert report.main(['$folder', '--out', '$tmp/cutcheck']) == 0
cut = {name: texts for name, texts in plots.CUT.items() if texts}
print(cut if cut else f'uncut {len(plots.CUT)}')"
done
# One model measured at one GPU count (make demo's report): each strategy's point and whiskers
# drawn beside the others', not on one vertical line, and the axis spans the count either side.
expect "plots: series at one x drawn apart, the axis a factor 2 either side" 0 '^ok 2 series apart$' -- $PY -c "
import sys; sys.path.insert(0, '$ROOT/analysis')
import matplotlib; matplotlib.use('Agg')
import plots
kept = {}
save = plots.save
plots.save = lambda fig, out, name: kept.setdefault(name, [l.get_xdata() for ax in fig.axes for l in ax.lines
                                                            if len(l.get_xdata()) and l.get_marker() == 'o']
                                                   + [fig.axes[0].get_xlim()]) and save(fig, out, name)
plots.make_all(['$tmp/alone'], '$tmp/alone-figs')
*xs, lim = kept['tflops_vs_gpus']
assert len(xs) == 2 and len({float(x[0]) for x in xs}) == 2, xs
assert lim[0] <= 2 * 0.5 + 1e-9 and lim[1] >= 2 * 2 - 1e-9, lim
print('ok', len(xs), 'series apart')"
# A long legend (sixteen entries under one panel, as the ZeRO matrix's eight strategies with
# and without offload give) takes room of its own: the panel keeps its height.
expect "plots: a long legend under one panel leaves the panel its height" 0 '^ok panel [0-9.]+ in$' -- $PY -c "
import sys; sys.path.insert(0, '$ROOT/analysis')
import matplotlib; matplotlib.use('Agg')
import plots
fig, axes = plots.small_multiples([1], width=4.2, cols=2)
axes[0].plot([1, 2], [1, 2])
h = [matplotlib.lines.Line2D([], [], label=f'fsdp-optimizer-state-offload-optimizer {i}') for i in range(16)]
plots.finish_panels(fig, axes, '$tmp', 'legend16', 'x', h, 'title', ['GPU'])
tall = axes[0].get_position().height * fig.get_figheight()
assert tall >= 2.0, tall
assert not plots.CUT['legend16'], plots.CUT['legend16']
print(f'ok panel {tall:.2f} in')"
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

# --- the PyTorch scripts' preset table (analysis/torch_t5_step.py, used by hf_t5_step.py) is
# the programs' own: shapes, feed-forward, head and parameter count, every preset (their FLOP
# count is the programs' own plan, torch_t5_step.plan_flops) ---
expect "torch_t5_step.PRESETS = the programs' presets (shape, ffn, head, parameters)" 0 '^ok 15 presets$' -- \
  $PY - "$BIN" "$ROOT" <<'PYEOF'
import json, os, subprocess, sys, tempfile, types
sys.path.insert(0, os.path.join(sys.argv[2], "analysis"))
import torch_t5_step as t
binary = os.path.join(sys.argv[1], "fsdp_perf")
names = subprocess.run([binary, "--list-models"], capture_output=True, text=True).stdout.split()
assert sorted(names) == sorted(t.PRESETS), (names, sorted(t.PRESETS))
for name, (d, ff, layers, heads, dkv, vocab, ffn, tie) in t.PRESETS.items():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.json")
        r = subprocess.run([binary, "--model", name, "--batch", "2", "--seq-len", "16", "--dec-seq-len", "8", "--plan",
                            "--world-size", "1", "--schedule-json", path], capture_output=True, text=True)
        assert r.returncode in (0, 3), r.stderr  # 3: does not fit this host; the schedule is written
        s = json.load(open(path))
    assert (s["d_model"], s["d_ff"], s["layers"], s["heads"], s["d_kv"], s["vocab"], s["ffn"], s["tie_embeddings"]) == \
        (d, ff, layers, heads, dkv, vocab, ffn, int(tie)), name
    a = types.SimpleNamespace(d_model=d, d_ff=ff, layers=layers, heads=heads, d_kv=dkv, vocab=vocab, ffn=ffn, tie=tie,
                              num_buckets=32, batch=2, seq_len=16, dec_seq_len=8)
    count = sum(int(__import__("numpy").prod(shape)) for _, ts in t.unit_layout(a) for _, shape, _ in ts)
    assert count == s["param_count"], (name, count, s["param_count"])
print(f"ok {len(t.PRESETS)} presets")
PYEOF

expect "torch_t5_step.plan_flops: the program's FLOPs for the script's own shape flags (gated, untied)" 0 '^ok [0-9.e+]+$' -- \
  $PY - "$BIN" "$ROOT" <<'PYEOF'
import json, os, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(sys.argv[2], "analysis"))
import torch_t5_step as t
a = t.parse_args(["--model", "t5-v1_1-small", "--layers", "2", "--batch", "3", "--seq-len", "16", "--dec-seq-len", "8",
                  "--activation-checkpointing", "--bin", sys.argv[1]])
model, hw = t.plan_flops(a)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "s.json")
    subprocess.run([os.path.join(sys.argv[1], "fsdp_perf"), "--model", "t5-v1_1-small", "--layers", "2", "--batch", "3",
                    "--seq-len", "16", "--dec-seq-len", "8", "--activation-checkpointing", "--plan", "--world-size", "1",
                    "--schedule-json", path], capture_output=True, check=False)
    s = json.load(open(path))
assert (model, hw) == (s["model_flops_per_step"], s["hardware_flops_per_step"]), (model, hw, s["model_flops_per_step"])
assert hw > model > 0
print(f"ok {model:.6g}")
PYEOF

# --- one command-line convention: every analysis script's --help documents every argument ---
expect "analysis scripts: --help exits 0, whole descriptions, every argument documented" 0 \
  'analysis scripts follow the convention' -- $PY $ROOT/tests/check_cli.py

# --- Perfetto / chrome://tracing timelines: slices = HDF5 events per rank and lane, ordered;
# a real 4-rank result (the demo's model and size) prints its conversion time ---
"${MPI4[@]}" $BIN/fsdp_perf --model t5-small --batch 2 --seq-len 64 --steps 2 --warmup 1 \
  --sharding hybrid --shard-size 2 --out $tmp/small4.h5 >"$tmp/out" 2>&1 || bad "fsdp t5-small 4-rank run"
expect "to_perfetto: JSON per result matches its events, memory and warm-up steps" 0 'converted in' -- \
  $PY $ROOT/tests/check_perfetto.py $tmp/small4.h5 $R/ddp.h5 $R/full.h5 $R/projected/t5-611m-fsdp-hybrid8-g512-b8-s512.h5
sed -n 's/^ok    small4.h5/      to_perfetto: small4.h5/p' "$tmp/out"

# --- bad input ---
mkdir -p $tmp/empty $tmp/mixed
cp $R/ddp.h5 $tmp/mixed/
$PY -c "import h5py; f = h5py.File('$tmp/mixed/v99.h5', 'w'); f.attrs['schema_version'] = 99" 2>/dev/null
expect "report: an empty folder" 2 'no .h5 results' -- $PY $ROOT/analysis/report.py $tmp/empty
expect "report: a file of another schema is skipped, the rest reported, exit 3" 3 \
  'skipped .*v99.h5: .*schema_version 99, this reader knows 1, 2' -- $PY $ROOT/analysis/report.py $tmp/mixed
expect "projection without calibration data when required" 2 'no calibration data' -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/local-cpu.toml --model t5-tiny --gpus 2 --batch 2 \
  --seq-len 16 --require-calibration --out $tmp/p1
grep -v '^latency_us' $ROOT/runs/clusters/h100-80gb.toml | sed '/^\[inter\]/,$!b' >$tmp/broken.toml
expect "cluster description missing a field" 2 "missing field '(intra|inter).latency_us'" -- \
  $PY $ROOT/analysis/project.py --cluster $tmp/broken.toml --model t5-tiny --gpus 2 --out $tmp/p2
expect "projection: unknown strategy" 2 "unknown strategy 'zero4'" -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/h100-80gb.toml --model t5-tiny --strategies zero4 \
  --gpus 2 --out $tmp/p3

# --- unreadable files: each skipped with one line, the rest used, exit 3 (all unreadable: 2) ---
U=$tmp/unreadable
UB=$tmp/unreadable-only # plots and report search folders recursively: not inside $U
mkdir -p $U $UB
cp $R/ddp.h5 $R/full.h5 $U/
head -c 20000 $R/full.h5 >$UB/truncated.h5 # what a node crash during the write leaves
echo "not a result" >$UB/text.h5
: >$UB/empty.h5
cp $R/ddp.h5 $UB/zeroed.h5 # a zeroed object header: the HDF5 library may crash reading it
dd if=/dev/zero of=$UB/zeroed.h5 bs=1 seek=2000 count=3000 conv=notrunc status=none
$PY -c "import h5py; h5py.File('$UB/foreign.h5', 'w').attrs['schema_version'] = 1"
"${MPI2[@]}" $BIN/collective_perf -b 1K -e 1K -n 2 -w 1 --out $UB/collective.h5 >/dev/null 2>&1 # not training
cp $UB/*.h5 $U/
NBAD=$(ls $UB | wc -l)
skipped_all() { # skipped_all TOOL: after expect, one "skipped" line per unreadable file
  local n
  n=$(grep -c "^$1: skipped $U/.*: not a readable shardbench result" "$tmp/out")
  if [ "$n" -eq "$NBAD" ]; then ok "$1: one line per unreadable file"; else
    echo "      $n skipped lines, expected $NBAD" >>"$tmp/out"; bad "$1: one line per unreadable file"; fi
}
expect "summarize: unreadable files skipped, the two runs tabled, exit 3" 3 'fsdp_perf +fsdp-full' -- \
  $PY $ROOT/analysis/summarize.py $U/*.h5 --csv $tmp/u.csv
skipped_all summarize
check "summarize: the CSV has the two runs" test "$(wc -l <$tmp/u.csv)" -eq 3
expect "compare: projected results compared as measured ones, marked projected, '-' for the loss" 0 \
  '^fsdp-hybrid8 +t5-611m +512 .* - +projected$' -- \
  $PY $ROOT/analysis/compare.py $R/projected/t5-611m-ddp-g512-b8-s512.h5 $R/projected/t5-611m-fsdp-hybrid8-g512-b8-s512.h5 \
  --plot $tmp/cmp-projected.png
expect "compare: unreadable files skipped, exit 3" 3 'fsdp-full +t5-tiny' -- $PY $ROOT/analysis/compare.py $U/*.h5
skipped_all compare
expect "plots: unreadable files skipped, the figures made, exit 3" 3 'plots: memory: ' -- \
  $PY $ROOT/analysis/plots.py $U --out $tmp/uplots
skipped_all plots
expect "report: unreadable files skipped, the report of the rest, exit 3" 3 'report: .*index.html \(4 figures, .*2 runs' -- \
  $PY $ROOT/analysis/report.py $U --out $tmp/ureport
skipped_all report
for t in summarize compare; do
  expect "$t: nothing readable, exit 2" 2 "$t: no readable" -- $PY $ROOT/analysis/$t.py $UB/*.h5
done
expect "plots: nothing readable, exit 2" 2 'no readable result' -- $PY $ROOT/analysis/plots.py $UB --out $tmp/up2
expect "report: nothing readable, exit 2" 2 'no readable result' -- $PY $ROOT/analysis/report.py $UB --out $tmp/ur2
expect "shardbench_h5.py --status: finished results and unreadable files" 3 "zeroed.h5: unreadable" -- \
  $PY $ROOT/analysis/shardbench_h5.py --status $U/ddp.h5 $UB/zeroed.h5

# --- the projection reproduces measured local runs (docs/projection.md states the error) ---
# On recorded runs (tests/data/projection/README.md), as scripts/validate-projection.sh does
# for 2 ranks: measuring here would make the verdict rest on this machine's load of the day.
PD=$ROOT/tests/data/projection
PV=$tmp/val
mkdir -p $PV/measured
cp $PD/measured/*.h5 $PV/measured/ && cp $PD/calibration/ddp-w2.h5 $PV/measured/ddp-w2.h5
PROJ2=(--cluster $ROOT/runs/clusters/local-cpu.toml --model t5-small --gpus 2 --batch 2 --seq 64
  --calibrate-collectives $PD/calibration/coll-w2.h5 --require-calibration --out $PV/projected)
check "projection of FSDP full and none, calibrated by the recorded DDP run" \
  $PY $ROOT/analysis/project.py "${PROJ2[@]}" --strategies fsdp-full,fsdp-none --calibrate-run $PD/calibration/ddp-w2.h5
check "projection of DDP, calibrated by the recorded FSDP no-shard run" \
  $PY $ROOT/analysis/project.py "${PROJ2[@]}" --strategies ddp --calibrate-run $PD/measured/none-w2.h5
expect "projection within ${PROJECTION_MAX_ERROR:=0.5} of the recorded measured 2-rank runs" 0 'worst \|error\|' -- \
  $PY $ROOT/analysis/validate_projection.py --measured $PV/measured --projected $PV/projected \
  --max-error "$PROJECTION_MAX_ERROR"
expect "... each projected point of the recorded calibration carries its range and the calibration's spread" 0 '^ok$' -- \
  $PY - $PV/projected <<'PYEOF'
import glob, sys
import h5py
for p in glob.glob(sys.argv[1] + "/*.h5"):
    a = h5py.File(p, "r").attrs
    assert 0 < a["step_time_low_s"] < a["median_step_time_s"] < a["step_time_high_s"], p
    assert "step-to-step compute spread" in a["calibration_spread"] and a["calibration_disturbed"] == "", p
print("ok")
PYEOF
expect "validate: a path that does not exist is one line, exit 2" 2 '^validate: error: --measured .*/nope: no such file or folder$' -- \
  $PY $ROOT/analysis/validate_projection.py --measured $PV/nope --projected $PV/projected
expect "validate: --max-error nan is one line, exit 2" 2 '^validate: error: --max-error nan is not allowed \(a finite number >= 0\)$' -- \
  $PY $ROOT/analysis/validate_projection.py --measured $PV/measured --projected $PV/projected --max-error nan
echo "not a result" >$tmp/garbage.h5
expect "validate: an unreadable file is skipped with one line, the rest compared, exit 3" 3 'skipped .*garbage.h5: not a readable' -- \
  $PY $ROOT/analysis/validate_projection.py --measured $PV/measured $tmp/garbage.h5 --projected $PV/projected

# --- bad input files and output paths (analysis/cli.py holds the checks): one line naming the
# file or path and what is allowed, exit 2, no traceback, nothing written or replaced ---
BP=$tmp/badpaths
mkdir -p $BP/in && : >$BP/afile
refused() { # refused NAME PATTERN -- command...: exit 2 and one line, PATTERN (so no traceback)
  local name=$1 pattern=$2
  shift 3
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne 2 ]; then echo "      exit $rc, expected 2" >>"$tmp/out"; bad "$name"; return; fi
  if [ "$(wc -l <"$tmp/out")" -ne 1 ] || ! grep -qE -- "$pattern" "$tmp/out"; then
    echo "      expected one line /$pattern/" >>"$tmp/out"; bad "$name"; return; fi
  ok "$name"
}
# a folder nothing can be created in, even by root (who may write where the mode says no)
if (: >/sys/.shardbench-check) 2>/dev/null; then rm -f /sys/.shardbench-check; RO=; else RO=/sys; fi
LOCAL=(--cluster $ROOT/runs/clusters/local-cpu.toml --model t5-tiny --gpus 2 --batch 2 --seq-len 16 --strategies ddp)
printf '# caf\xe9\nname = "x"\n' >$BP/in/latin1.toml
sed 's/^gemm_tflops = .*/gemm_tflops = nan/' $ROOT/runs/clusters/local-cpu.toml >$BP/in/nan.toml
sed 's/^gpu_memory_gib = .*/gpu_memory_gib = inf/' $ROOT/runs/clusters/local-cpu.toml >$BP/in/inf.toml
refused "project: a cluster description that is not UTF-8" \
  "^project: error: $BP/in/latin1.toml: not UTF-8 text \(byte 0xe9 on line 1\): a cluster description must be UTF-8" -- \
  $PY $ROOT/analysis/project.py --cluster $BP/in/latin1.toml --model t5-tiny --gpus 2 --out $BP/p
refused "project: a run matrix (--matrix) that is not UTF-8" \
  "^project: error: $BP/in/latin1.toml: not UTF-8 text \(byte 0xe9 on line 1\): a run matrix must be UTF-8" -- \
  $PY $ROOT/analysis/project.py --cluster $ROOT/runs/clusters/local-cpu.toml --matrix $BP/in/latin1.toml --out $BP/p
refused "project: nan in a cluster description, by field" \
  "^project: error: cluster description .*: field 'compute.gemm_tflops' = nan is not allowed \(must be a finite positive number\)$" -- \
  $PY $ROOT/analysis/project.py --cluster $BP/in/nan.toml --model t5-tiny --gpus 2 --out $BP/p
refused "project: inf in a cluster description, by field" \
  "^project: error: cluster description .*: field 'gpu_memory_gib' = inf is not allowed \(must be a finite positive number\)$" -- \
  $PY $ROOT/analysis/project.py --cluster $BP/in/inf.toml --model t5-tiny --gpus 2 --out $BP/p
# output paths: a missing folder, a folder where a file goes (or a file where a folder goes), a read-only place
A=$ROOT/analysis
refused "summarize: --csv in a missing folder" "^summarize: error: --csv '$BP/nodir/s.csv': directory '$BP/nodir' does not exist" -- \
  $PY $A/summarize.py $R/ddp.h5 $R/full.h5 --csv $BP/nodir/s.csv
refused "summarize: --csv naming a folder" "^summarize: error: --csv '$BP' is a directory \(must name a file\)" -- \
  $PY $A/summarize.py $R/ddp.h5 --csv $BP
refused "compare: --plot in a missing folder" "^compare: error: --plot '$BP/nodir/c.png': directory '$BP/nodir' does not exist" -- \
  $PY $A/compare.py $R/ddp.h5 $R/full.h5 --plot $BP/nodir/c.png
refused "compare: --plot naming a folder" "^compare: error: --plot '$BP' is a directory \(must name a file\)" -- \
  $PY $A/compare.py $R/ddp.h5 $R/full.h5 --plot $BP
refused "compare: --plot in a format matplotlib does not write" \
  "^compare: error: --plot '$BP/c.xyz': the file name must end in one of .*\.pdf, .*\.png" -- \
  $PY $A/compare.py $R/ddp.h5 $R/full.h5 --plot $BP/c.xyz
refused "plots: --out naming a file" "^plots: error: --out '$BP/afile' exists and is not a directory" -- \
  $PY $A/plots.py $R/ddp.h5 --out $BP/afile
refused "plots: --out below a file" "^plots: error: --out '$BP/afile/sub': '$BP/afile' is not a directory" -- \
  $PY $A/plots.py $R/ddp.h5 --out $BP/afile/sub
refused "report: --out naming a file" "^report: error: --out '$BP/afile' exists and is not a directory" -- \
  $PY $A/report.py $tmp/alone --out $BP/afile
refused "layouts: --out below a file" "^layouts: error: --out '$BP/afile/sub': '$BP/afile' is not a directory" -- \
  $PY $A/layouts.py $R/ddp.h5 --out $BP/afile/sub
refused "to_perfetto: -o in a missing folder" "^to_perfetto: error: --out '$BP/nodir/t.json': directory '$BP/nodir' does not exist" -- \
  $PY $A/to_perfetto.py $R/ddp.h5 -o $BP/nodir/t.json
refused "regress: --report-dir naming a file" "^regress: error: --report-dir '$BP/afile' exists and is not a directory" -- \
  $PY $A/regress.py $ROOT/tests/data/regress $ROOT/tests/data/regress/run00.h5 --report-dir $BP/afile
refused "project: --out naming a file" "^project: error: --out '$BP/afile' exists and is not a directory" -- \
  $PY $A/project.py "${LOCAL[@]}" --out $BP/afile
if [ -n "$RO" ]; then
  for t in "summarize.py $R/ddp.h5 --csv|$RO/s.csv" "compare.py $R/ddp.h5 $R/full.h5 --plot|$RO/c.png" \
    "plots.py $R/ddp.h5 --out|$RO/plots" "report.py $tmp/alone --out|$RO/report" "layouts.py $R/ddp.h5 --out|$RO/plots" \
    "to_perfetto.py $R/ddp.h5 -o|$RO/t.json" "regress.py $ROOT/tests/data/regress $ROOT/tests/data/regress/run00.h5 --report-dir|$RO/rep" \
    "project.py ${LOCAL[*]} --out|$RO/proj"; do
    tool=${t%%.py*} args=${t%|*} path=${t#*|}
    refused "$tool: an output path in a read-only place ($RO)" "^$tool: error: .*'$path'.*: directory '$RO' is not writable" -- \
      $PY $A/$args $path
  done
fi
check "... none of them wrote anything" bash -c "[ \"\$(ls -A $BP)\" = \"$(printf 'afile\nin')\" ] && [ ! -s $BP/afile ]"
# project.py names its results as slurm/sweep names the measurements: pointed at a sweep's
# folder it replaces nothing measured, with or without --overwrite; a projection of its own
# only with --overwrite; an exit 2 leaves no folder behind.
mkdir -p $BP/sweep && cp $R/ddp.h5 $BP/sweep/t5-tiny-ddp-g2-b2-s16.h5
for extra in "" --overwrite; do
  refused "project: a measured result in --out is never replaced${extra:+ (even with $extra)}" \
    "^project: error: --out '$BP/sweep': t5-tiny-ddp-g2-b2-s16.h5 is not a projected result .*never replaced" -- \
    $PY $ROOT/analysis/project.py "${LOCAL[@]}" --out $BP/sweep $extra
  check "... the measurement is as it was" cmp $R/ddp.h5 $BP/sweep/t5-tiny-ddp-g2-b2-s16.h5
done
check "project: a new folder of projections" $PY $ROOT/analysis/project.py "${LOCAL[@]}" --out $BP/proj
refused "project: an existing projection is replaced only with --overwrite" \
  "^project: error: --out '$BP/proj': t5-tiny-ddp-g2-b2-s16.h5 exists \(pass --overwrite to replace" -- \
  $PY $ROOT/analysis/project.py "${LOCAL[@]}" --out $BP/proj
check "... and with --overwrite it is" $PY $ROOT/analysis/project.py "${LOCAL[@]}" --out $BP/proj --overwrite
expect "project: exit 2 after a first point was projected" 2 "^project: error: --micro-batches 3 is not allowed" -- \
  $PY $ROOT/analysis/project.py "${LOCAL[@]}" --strategies ddp,ddp-pp2 --micro-batches 3 --out $BP/new/out
check "... leaves no folder and no result behind" test ! -e $BP/new
# regress names the points only one side has in-place or out-of-place, never "in-of-place"
mkdir -p $BP/regress
$PY - $ROOT/tests/data/regress/run05.h5 $BP/regress/out-of-place.h5 <<'PYEOF'
import shutil, sys, h5py
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:  # the current run without its in-place points
    s, attrs = f["samples"][()], dict(f["samples"].attrs)
    del f["samples"]
    d = f.create_dataset("samples", data=s[s["in_place"] == 0])
    for k, v in attrs.items():
        d.attrs[k] = v
PYEOF
refused "regress: points of one side only, named in-place or out-of-place" \
  "^regress: cannot compare: operations or sizes differ: only in baseline: all-gather in-place 65536 B, " -- \
  $PY $ROOT/analysis/regress.py $ROOT/tests/data/regress $BP/regress/out-of-place.h5 --report-dir $BP/rep
cp "$tmp/out" $BP/regress.out
check "... never 'in-of-place'" bash -c "! grep -q 'in-of-place' $BP/regress.out"
# docs/usage.md's regress sample (no --report-dir) names the folder regress writes by default
check "usage.md's regress sample: the default report folder" bash -c "grep -qx \"regress: wrote \$(COLUMNS=200 $PY \
  $ROOT/analysis/regress.py --help | grep -o 'default: regress-report' | cut -d' ' -f2)/report.md and report.png .*\" \
  $ROOT/docs/usage.md"

# --- the memory picture from the plan alone (analysis/model_states.py): a small case end to
# end; the per-parameter bytes against the ZeRO formulas, recomputed here from the CSV; a
# wrong formula and a missing extra each stop it (exit 1, one line, nothing written); bad
# input is one line, exit 2, nothing written ---
MS=(--model t5-small --gpus 3,8 --fit-models t5-tiny,t5-small --batch 2 --seq-len 64)
expect "model_states: t5-small on 3 and 8 GPUs, the largest of two presets on 8" 0 \
  '^fsdp-full +8 .*no-16bit-shard -0\.2500, in-flight' -- $PY $ROOT/analysis/model_states.py "${MS[@]}" --out $tmp/ms
cp "$tmp/out" $tmp/ms.stdout
check "... one notice on offload: included, or not in this build" grep -qE \
  '^(offload is not in this build .*: no offload rows|fsdp_perf has --cpu-offload: [0-9]+ offload variants included)$' \
  $tmp/ms.stdout
expect "... its files parse; plan = ZeRO formula + named extras, recomputed from the CSV" 0 '^ok [0-9]+ rows$' -- \
  $PY - $tmp/ms <<'PYEOF'
import csv, os, sys
import matplotlib.image
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "model_states.csv"))))
fits = list(csv.DictReader(open(os.path.join(d, "largest_fit.csv"))))
assert matplotlib.image.imread(os.path.join(d, "model_states.png")).shape[2] in (3, 4)
assert "flan" not in open(os.path.join(d, "model_states.txt")).read().split("largest T5")[1]
K = 12  # fp32 master 4 + Adam 8: the ZeRO paper's K for mixed-precision Adam
formula = {0: lambda n: 4 + K, 1: lambda n: 4 + K / n, 2: lambda n: 2 + (2 + K) / n, 3: lambda n: (4 + K) / n}
base = {r["strategy"] for r in rows if r["offload"] == "-"}
assert base == {"ddp", "fsdp-none", "fsdp-optimizer-state", "fsdp-grad-op", "fsdp-full"}, base
assert sorted({int(r["gpus"]) for r in rows}) == [3, 8]
for r in rows:
    n, psi, pad = int(r["gpus"]), int(r["params"]), int(r["params_padded"])
    g = lambda k: float(r[k])
    states = sum(g(c) for c in ("parameters", "gradients", "optimizer_state", "comm_buffers"))
    assert states == g("model_states"), r
    if r["offload"] != "-":
        continue
    stage = int(r["zero_level"])
    assert abs(g("formula") - formula[stage](n) * psi) <= 1, (r["strategy"], n, g("formula"))
    bpp = (states - g("formula")) / psi  # bytes per parameter beyond the formula: the named extras
    named = (g("padding") + g("reduced_shard") + g("no_16bit_shard")) / psi
    assert abs(bpp - named - g("in_flight") / psi) < 1e-6
    if stage == 0 or r["strategy"] == "ddp":
        assert states == 16 * psi and g("in_flight") == 0, r  # exact: (4 + K) bytes per parameter
    if stage == 1:  # whole bf16 parameters and gradients padded, the shards, the reduced gradient shard
        assert states == 4 * pad + (K + 2) * pad / n and g("in_flight") == 0, r
    if stage >= 2:
        assert g("in_flight_min") <= g("in_flight") <= g("in_flight_max"), r
        assert abs(states - g("in_flight") - (2 * pad if stage == 2 else 0) - (2 + K) * pad / n) < 1, r
    if n == 3:
        assert stage == 0 or g("padding") > 0, r  # t5-small's units are not multiples of 3
fits = [f for f in fits if f["strategy"] in base]
assert len(fits) == 2 * len(base) and all(f["largest"] == "t5-small" for f in fits), fits
print("ok", len(rows), "rows")
PYEOF
# on a terminal each row is said as it finishes (stderr); a pipe gets the table alone (above: 2>&1)
expect "model_states: on a terminal, each row as it finishes" 0 '^ok progress$' -- \
  $PY - $ROOT/analysis "${MS[@]}" --gpus 3 --fit-models t5-tiny --out $tmp/ms-tty <<'PYEOF'
import io, sys
sys.path.insert(0, sys.argv[1])
import model_states
class Tty(io.StringIO):
    def isatty(self):
        return True
err, out = Tty(), io.StringIO()
sys.stderr, real = err, sys.stdout
sys.stdout = out
code = model_states.main(sys.argv[2:])
sys.stdout, sys.stderr = real, sys.__stderr__
said = err.getvalue().splitlines()
assert code == 0, err.getvalue()
assert said[0] == "model_states: planning 27 layouts (the curve's 9, the largest-fit search's 18)", said
assert said[1].startswith("model_states: 1/") and " ddp at 3 GPUs: model states " in said[1], said
assert any("largest fit on 8 GPUs, fsdp-full with checkpointing: t5-tiny" in x for x in said), said
assert "model_states: 1/" not in out.getvalue(), "progress is stderr's"
print("ok progress")
PYEOF
grep -q 'model_states: [0-9]*/' $tmp/ms.stdout && bad "... not in a pipe" || ok "... not in a pipe"
refused "model_states: a wrong formula (K = 8) stops it: exit 1, one line" \
  '^model_states: mismatch: ddp at 3 GPUs \(t5-small\): model states .* outside the in-flight bounds \[0, 0\] B$' -- \
  bash -c "$PY -c \"import sys; sys.path.insert(0, '$ROOT/analysis'); import model_states as m; m.K = 8
sys.exit(m.main(sys.argv[1:]))\" ${MS[*]} --out $tmp/ms-k8; [ \$? = 1 ] && exit 2"
check "... nothing written" test ! -e $tmp/ms-k8
refused "model_states: ZeRO-1 without its reduced gradient shard named stops it: exit 1, one line" \
  '^model_states: mismatch: fsdp-optimizer-state at 3 GPUs \(t5-small\): .* outside the in-flight bounds' -- \
  bash -c "$PY -c \"import sys; sys.path.insert(0, '$ROOT/analysis'); import model_states as m
real = m.exact_terms
def unnamed(s, psi, psi_pad, n):
    t = real(s, psi, psi_pad, n)
    t['g16'][1].pop('reduced-shard', None)
    return t
m.exact_terms = unnamed
sys.exit(m.main(sys.argv[1:]))\" ${MS[*]} --out $tmp/ms-z1; [ \$? = 1 ] && exit 2"
check "... nothing written" test ! -e $tmp/ms-z1
for bad in "--gpus 0|--gpus '0' is not allowed \(a comma-separated list of distinct integers from 1 to 16777216\)" \
  "--gpus 8,x|--gpus '8,x' is not allowed" "--model t5-huge|--model 't5-huge' is not allowed \(allowed: t5-611m, " \
  "--gpu-memory-gib 0|--gpu-memory-gib '0' is not allowed \(a finite number > 0 and <= 1048576\)" \
  "--bin $tmp/nobin|--bin '$tmp/nobin' is not allowed \(a folder holding ddp_perf and fsdp_perf" \
  "--fit-models t5-small,nope|--fit-models 't5-small,nope' is not allowed" \
  "--batch 99999999|ddp_perf refuses t5-small at 3 GPUs: --batch 99999999 x --seq-len 64 = .* is not allowed"; do
  refused "model_states refuses ${bad%%|*} in one line, exit 2" "^model_states: error: ${bad#*|}" -- \
    $PY $ROOT/analysis/model_states.py "${MS[@]}" ${bad%%|*} --out $tmp/ms-bad
  check "... nothing written" test ! -e $tmp/ms-bad
done
# Offload rows (fsdp_perf --cpu-offload): each variant's GPU side equals the formula's remaining
# terms plus the named extras (the script stops otherwise), and the plan's host peak is a
# column that holds at least the offloaded terms.
expect "model_states: the offload rows, host memory a column" 0 \
  '^fsdp-full\+offload-params +8 .* \(0\.[0-9]+\)$' -- $PY $ROOT/analysis/model_states.py "${MS[@]}" --fit-models t5-tiny \
  --out $tmp/ms-off
check "... the CSV: 4 offload variants x 2 GPU counts, each with its host bytes" $PY -c "
import csv; r = [x for x in csv.DictReader(open('$tmp/ms-off/model_states.csv')) if x['offload'] != '-']
assert len(r) == 8 and all(float(x['host']) >= float(x['host_model_states']) > 0 for x in r), r"
check "... ZeRO-2 under optimizer offload names the bf16 shard it keeps" $PY -c "
import csv; r = [x for x in csv.DictReader(open('$tmp/ms-off/model_states.csv')) if x['strategy'] == 'fsdp-grad-op+offload-optimizer']
assert r and all(float(x['offload_shard']) > 0 for x in r), r"
refused "model_states: a non-empty --out only with --overwrite" \
  "^model_states: error: --out '$tmp/ms' is not empty \(pass --overwrite to replace its files\)$" -- \
  $PY $ROOT/analysis/model_states.py "${MS[@]}" --out $tmp/ms
check "... and with --overwrite it is replaced" $PY $ROOT/analysis/model_states.py "${MS[@]}" --out $tmp/ms --overwrite

summary
