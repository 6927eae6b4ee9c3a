#!/usr/bin/env bash
# analysis/regress.py knows its own power: a point whose upper bound on the slowdown (the
# `bound` column: the measured change plus the margin its spread needs) is above --threshold,
# and that is not flagged, is "inconclusive", and the comparison exits 3 (never 0) unless a
# regression was found elsewhere (exit 1). On data:
# the recorded runs of tests/data/regress (its README), rescaled in copies, never this
# machine's timing of the day:
#   (a) a baseline too noisy for the threshold (whole runs scaled 0.5x-2x) against a current
#       unchanged or 2x slower at every point: inconclusive, exit 3; real runs as recorded
#       too (5 baseline runs; 8 against a current with the all-reduce 2x slower, which the
#       verdict without power passed as "no regression", exit 0);
#   (b) a quiet baseline (real runs with their run-to-run swings taken out: run times
#       0.99-1.01 of one run's, each run's own iterations) and an unchanged current: exit 0;
#       1.3x slower: exit 1; a threshold below its bound: exit 3;
#   (c) the summary line and report.md name the bounds (checked against the table) and say
#       what to do;
#   (d) slurm/interconnect.sbatch (run with bash and mpirun, no Slurm): regress.py's exit 3
#       passes through with an "=== interconnect ...: INCONCLUSIVE" line naming the report;
#       a failed collective_perf exits 4, no longer 3; its history (SB_HISTORY) reaches
#       regress.py --history on the next check;
#   (e) the history's noise model (--history): a quiet-minute baseline's false alarm on a
#       busier night is no alarm with nights +-20 % apart in the history; calm nights let an
#       unchanged check pass where the baseline alone is inconclusive, and catch a 30 %
#       slowdown; a short history falls back to the baseline, named; the spread is the one
#       since the last change point; an outlier check is left out; byte copies count once
#       (baseline, current, history).
# REGRESS=path and IC_SBATCH=path test other copies (e.g. an older version, which must fail).
# Prints one ok/FAIL line per check and "N passed, M failed"; exit 0 all passed, 1 a failure.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
REGRESS=${REGRESS:-$ROOT/analysis/regress.py}
IC_SBATCH=${IC_SBATCH:-$ROOT/slurm/interconnect.sbatch}
D=$tmp/data
regress() { $PY "$REGRESS" "$@"; }

PYTHONPATH="$ROOT/analysis" $PY - "$ROOT/tests/data/regress" "$D" <<'PYEOF' >"$tmp/gen.out" 2>&1 || { cat "$tmp/gen.out"; exit 1; }
import glob, os, shutil, sys, h5py, numpy as np
from shardbench_h5 import names as names_of  # (PYTHONPATH: analysis/)
src, out = sys.argv[1:]
runs = sorted(glob.glob(os.path.join(src, "run*.h5")))
assert len(runs) == 20, runs

def rewrite(path, dst, edit):
    """A copy of the run `path` at `dst`, its samples table passed through edit(samples, op names)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(path, dst)
    with h5py.File(dst, "r+") as f:
        s = f["samples"][()]
        edit(s, names_of(f["samples"]))
        f["samples"][...] = s

def scale(factor, op=None):
    def edit(s, names):
        sel = np.ones(len(s), bool) if op is None else s["op"] == names.index(op)
        s["time"][sel] *= factor
    return edit

def points(s):
    return sorted({(int(r["op"]), int(r["in_place"]), int(r["size"])) for r in s})

def run_time(s, sel):  # regress.py's time of a run at a point: median over iterations of the slowest rank
    its = np.unique(s["iteration"][sel])
    return np.median([s["time"][sel & (s["iteration"] == i)].max() for i in its])

ref = h5py.File(runs[0], "r")["samples"][()]
centre = {k: run_time(ref, (ref["op"] == k[0]) & (ref["in_place"] == k[1]) & (ref["size"] == k[2])) for k in points(ref)}

def quiet(factor, op=None, op_factor=1.0):
    """Every point of a real run moved so that its run time is run00's times `factor` (times
    op_factor for the operation `op`): the run's own iterations, not the machine's swings."""
    def edit(s, names):
        for k in points(s):
            sel = (s["op"] == k[0]) & (s["in_place"] == k[1]) & (s["size"] == k[2])
            f = factor * (op_factor if names[k[0]] == op else 1.0)
            s["time"][sel] *= centre[k] * f / run_time(s, sel)
    return edit

# (a) too noisy a baseline: runs 0-7, each whole run scaled by a random factor, 0.5x-2x
# (log-uniform, fixed seed); currents: runs 8-10 as recorded, and 2x slower at every point
factors = np.exp(np.random.default_rng(20261127).uniform(np.log(0.5), np.log(2.0), 8))
print("noisy baseline factors:", " ".join(f"{f:.2f}" for f in factors))
for j, f in enumerate(factors):
    rewrite(runs[j], f"{out}/noisy/base/{j}.h5", scale(f))
for j in range(3):
    rewrite(runs[8 + j], f"{out}/noisy/same/{j}.h5", scale(1.0))
    rewrite(runs[8 + j], f"{out}/noisy/slow2x/{j}.h5", scale(2.0))
# a small baseline, as recorded: 5 baseline runs (runs 0-4), 3 current (runs 5-7)
for j in range(5):
    rewrite(runs[j], f"{out}/real5/base/{j}.h5", scale(1.0))
for j in range(3):
    rewrite(runs[5 + j], f"{out}/real5/same/{j}.h5", scale(1.0))
# docs/reliability.md's case: 8 real baseline runs (0-7), 3 real current runs (8-10) with the
# all-reduce made 2x slower; the old verdict said "no regression" (exit 0)
for j in range(8):
    rewrite(runs[j], f"{out}/real8/base/{j}.h5", scale(1.0))
for j in range(3):
    rewrite(runs[8 + j], f"{out}/real8/ar2x/{j}.h5", scale(2.0, "all-reduce"))
# (b) a quiet baseline: runs 0-7 at 0.99 ... 1.01 of run00's run times; currents from runs
# 8-10 at 0.995 ... 1.005 of them: unchanged, 1.3x slower. "mixed": the same baseline with
# the all-gather's runs spread by the noisy factors above; a current with the all-reduce 1.3x.
for j, f in enumerate([0.99, 0.993, 0.997, 1.0, 1.0, 1.003, 1.007, 1.01]):
    rewrite(runs[j], f"{out}/quiet/base/{j}.h5", quiet(f))
    rewrite(runs[j], f"{out}/mixed/base/{j}.h5", quiet(f, "all-gather", factors[j]))
for j, f in enumerate([0.995, 1.0, 1.005]):
    rewrite(runs[8 + j], f"{out}/quiet/same/{j}.h5", quiet(f))
    rewrite(runs[8 + j], f"{out}/quiet/slow13/{j}.h5", quiet(1.3 * f))
    rewrite(runs[11 + j], f"{out}/quiet/slow13-again/{j}.h5", quiet(1.3 * f))  # its re-check: still slow
    rewrite(runs[11 + j], f"{out}/quiet/same-again/{j}.h5", quiet(f))  # a re-check at the baseline's level
    rewrite(runs[14 + j], f"{out}/quiet/ar13-again/{j}.h5", quiet(f, "all-reduce", 1.3))
    rewrite(runs[8 + j], f"{out}/mixed/ar13/{j}.h5", quiet(f, "all-reduce", 1.3))
    rewrite(runs[8 + j], f"{out}/quiet/fast1/{j}.h5", quiet(0.99 * f))  # the bound's two sides: 1 % faster,
    rewrite(runs[8 + j], f"{out}/quiet/slow1/{j}.h5", quiet(1.01 * f))  # 1 % slower
# (e) the history's noise model: checks of 2 runs, a folder each, one a night (start times
# rewritten); a baseline and currents of the same run times. "nights": checks +-20 % apart;
# "calm": +-1 %; "step": 8 calm checks at 1.3, then 8 at 1.0; "outlier": 9 calm, one 3x.
import datetime
def at(path, when):
    with h5py.File(path, "r+") as f:
        f.attrs["start_time"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
def night(k):
    return datetime.datetime(2026, 11, 2) + datetime.timedelta(days=k, hours=2)
def checks(name, levels):
    for k, f in enumerate(levels):
        for j, g in enumerate([0.998, 1.002]):
            dst = f"{out}/hist/{name}/c{k:02d}/run{j}.h5"
            rewrite(runs[(2 * k + j) % 20], dst, quiet(f * g))
            at(dst, night(k) + datetime.timedelta(minutes=j))
calm = [1.0, 0.99, 1.01, 1.005, 0.995, 1.0, 0.992, 1.008, 1.003, 0.997]
checks("nights", [1.12, 0.85, 1.05, 0.92, 1.18, 0.96, 1.08, 0.88, 1.0, 1.15])
checks("calm", calm)
checks("short", calm[:5])
checks("step", [1.3 * f for f in calm[:8]] + calm[:8])  # a slowdown of 8 nights, then mended
checks("outlier", calm[:6] + [3.0] + calm[6:9])
checks("shortslow", [1.3 * f for f in calm[:3]])  # 3 checks since the baseline, each as slow as cur-slow13
checks("fresh", calm[:8] + [1.3 * f for f in calm[:3]])  # 8 calm nights, then a slowdown 3 nights old
def share(path, x):  # collective_perf's record of the CPU its ranks had (the least rank's)
    with h5py.File(path, "r+") as f:
        f.attrs["cpu_share_min"] = x
# "hungry": 10 calm checks and, among them, 2 at 3x whose ranks had 5 % of a core (other work
# on their cores); "hungry-unrecorded": the same figures from before the share was recorded
for name, rec in (("hungry", True), ("hungry-unrecorded", False)):
    checks(name, calm[:5] + [3.0, 3.0] + calm[5:])
    for k in range(12):
        for j in range(2):
            if rec:
                share(f"{out}/hist/{name}/c{k:02d}/run{j}.h5", 0.05 if k in (5, 6) else 0.97)
for j, f in enumerate([0.999, 1.0, 1.001]):  # a baseline recorded in one quiet minute
    rewrite(runs[10 + j], f"{out}/hist/base/{j}.h5", quiet(f))
    at(f"{out}/hist/base/{j}.h5", datetime.datetime(2026, 11, 1, 2, j))
    rewrite(runs[10 + j], f"{out}/hist/latebase/{j}.h5", quiet(f))  # the same, recorded after shortslow's checks
    at(f"{out}/hist/latebase/{j}.h5", datetime.datetime(2026, 11, 20, 2, j))
for j, f in enumerate([0.7, 1.0, 1.4]):  # one of a busy minute: its spread alone is inconclusive
    rewrite(runs[10 + j], f"{out}/hist/noisybase/{j}.h5", quiet(f))
for j, f in enumerate([0.599, 0.6, 0.601]):  # one of an untypically fast minute
    rewrite(runs[10 + j], f"{out}/hist/fastbase/{j}.h5", quiet(f))
for j, f in enumerate([0.7, 1.0, 1.4]):  # the busy minute's baseline with its ranks' CPU share
    rewrite(runs[10 + j], f"{out}/hist/sharebase/{j}.h5", quiet(f))
    share(f"{out}/hist/sharebase/{j}.h5", 0.97)
for name, f in (("same", 1.0), ("busy15", 1.15), ("slow13", 1.3)):
    for j, g in enumerate([0.998, 1.0, 1.002]):
        rewrite(runs[14 + j], f"{out}/hist/cur-{name}/run{j}.h5", quiet(f * g))
        at(f"{out}/hist/cur-{name}/run{j}.h5", datetime.datetime(2026, 12, 1, 2, j))
PYEOF
sed 's/^/  /' "$tmp/gen.out"

# check_figures NAME OUT REPORT_DIR N: the summary line of OUT names N inconclusive points and
# the smallest and largest `bound` of the table's inconclusive rows; report.md says the
# same, tables those rows as inconclusive with their figures, and says what to do.
check_figures() {
  local name=$1 out=$2 dir=$3 n=$4
  if $PY - "$out" "$dir/report.md" "$n" >"$tmp/fig.out" 2>&1 <<'PYEOF'; then ok "$name"; else cp "$tmp/fig.out" "$tmp/out"; bad "$name"; fi
import re, sys
out, report, n = open(sys.argv[1]).read(), open(sys.argv[2]).read(), int(sys.argv[3])
rows = [l.split() for l in out.splitlines() if l.split()[-1:] == ["inconclusive"]]
assert len(rows) == n, f"{len(rows)} inconclusive rows in the table, expected {n}"
figs = sorted((float(r[7].rstrip("%")), r[7]) for r in rows)  # bound: the 8th column
span = figs[0][1] if figs[0][1] == figs[-1][1] else f"{figs[0][1]} to {figs[-1][1]}"
line = [l for l in out.splitlines() if l.startswith("regress: ") and "may be up to" in l]
assert line, "no summary line naming the points' bounds"
print(line[0])
m = re.search(r"(\d+) (?:of \d+ points|other point\(s\) inconclusive:) may be up to ([^ (]+(?: to [^ (]+)?) slower", line[0])
assert m, "the summary line does not say how many points were inconclusive and how much slower they may be"
assert int(m.group(1)) == n, f"the summary says {m.group(1)} points, the table {n}"
assert m.group(2) == span, f"the summary says {m.group(2)}, the table's inconclusive rows {span}"
summary = re.sub(r" \((threshold [^,]*, )?alpha .*", "", line[0][len("regress: "):])
assert f"**{summary}**" in report, f"report.md does not carry the summary '{summary}'"
md_rows = [l for l in report.splitlines() if l.endswith("| inconclusive |")]
assert len(md_rows) == n, f"report.md tables {len(md_rows)} inconclusive rows, expected {n}"
assert sorted(l.split(" | ")[7] for l in md_rows) == sorted(r[7] for r in rows), \
    "report.md's bounds differ from the table's"
assert "SB_BASELINE_RUNS" in report and "quieter allocation" in report, "report.md does not say what to do"
PYEOF
}

# --- (a) too noisy a baseline: never "no regression" ---
expect "noisy baseline (runs scaled 0.5x-2x), current unchanged: inconclusive, exit 3" 3 \
  '^regress: inconclusive: 8 of 8 points may be up to \+[0-9]+% to \+[0-9]+% slower \(threshold 5%\); no regression found \(' -- \
  regress $D/noisy/base $D/noisy/same --report-dir $tmp/rep-a1
cp "$tmp/out" "$tmp/a1.out"
check_figures "... its summary line and report.md name the bounds of the table" "$tmp/a1.out" $tmp/rep-a1 8
expect "noisy baseline, current 2x slower at every point: inconclusive, exit 3 (never 0)" 3 \
  '^regress: inconclusive: 8 of 8 points may be up to' -- \
  regress $D/noisy/base $D/noisy/slow2x --report-dir $tmp/rep-a2
cp "$tmp/out" "$tmp/a2.out"
check_figures "... the same figures named" "$tmp/a2.out" $tmp/rep-a2 8
# The 2x slowdown went unflagged because it could not be seen: every point's figure is above +100 %.
check "... every point could only detect slowdowns above +100 % (so 2x could not be seen)" \
  awk '$NF == "inconclusive" { n++; v = $7; sub("%", "", v); if (v + 0 <= 100) bad++ } END { exit !(n == 8 && !bad) }' "$tmp/a2.out"
check "... the advice is printed: more baseline runs, iterations, a quieter allocation" \
  grep -q 'record more baseline runs (SB_BASELINE_RUNS; and check runs, SB_RUNS), more iterations (SB_ITERS), or on a quieter allocation' "$tmp/a2.out"
expect "noisy baseline, --method bootstrap: inconclusive too, exit 3" 3 '^regress: inconclusive: 8 of 8 points' -- \
  regress $D/noisy/base $D/noisy/slow2x --method bootstrap --report-dir $tmp/rep-a3
# 5 real baseline runs of this shared VM, as recorded: the all-reduce's three points that ran
# >= 40 % faster are improvements (judged, not inconclusive); the other 5 may be up to +14 % to +99 %
# slower (could detect +24 % to +106 %).
expect "5 real baseline runs, 3 real current: 5 of 8 inconclusive (up to +14% to +99%), exit 3" 3 \
  '^regress: inconclusive: 5 of 8 points may be up to \+14% to \+99% slower \(threshold 5%\); no regression found in the other 3 \(.*5 baseline runs, 3 current' -- \
  regress $D/real5/base $D/real5/same --report-dir $tmp/rep-a4
cp "$tmp/out" "$tmp/a4.out"
check_figures "... the figures named in the summary and report.md" "$tmp/a4.out" $tmp/rep-a4 5
check "... its improvements stay improvements" test "$(grep -c ' improvement$' "$tmp/a4.out")" -eq 3
# 8 real baseline runs, the all-reduce of 3 real runs made 2x slower (they ran ~30 % faster than
# the baseline's, so 1.3-1.5x its median): each point could only detect +79 % to +280 %, and may
# be up to +77 % to +210 % slower.
expect "8 real baseline runs, the all-reduce 2x slower in 3 real runs: inconclusive (up to +77% to +210%), exit 3, not 0" 3 \
  '^regress: inconclusive: 8 of 8 points may be up to \+77% to \+210% slower \(threshold 5%\); no regression found \(' -- \
  regress $D/real8/base $D/real8/ar2x --report-dir $tmp/rep-a5

# --- (b) a quiet baseline: conclusive ---
expect "quiet baseline, current unchanged: no regression, exit 0, the bound and detectable figures named" 0 \
  '^regress: no regression in 8 points; each is at most \+1\.9% slower, within the threshold \(smallest detectable \+1\.9%\) \(threshold 5%' -- \
  regress $D/quiet/base $D/quiet/same --report-dir $tmp/rep-b1
check "... no point inconclusive in report.md" bash -c "grep -q '| same |\$' $tmp/rep-b1/report.md && ! grep -q '| inconclusive |\$' $tmp/rep-b1/report.md"
expect "quiet baseline, current 1.3x slower: every point flagged, exit 1" 1 '^regress: 8 regression\(s\) in 8 points \(threshold 5%' -- \
  regress $D/quiet/base $D/quiet/slow13 --report-dir $tmp/rep-b2
expect "... confirmed by a re-check as slow: exit 1, said so" 1 '^regress: 8 regression\(s\) in 8 points, confirmed by the re-check \(threshold 5%' -- \
  regress $D/quiet/base $D/quiet/slow13 --confirm $D/quiet/slow13-again --report-dir $tmp/rep-b2c
expect "... a re-check back at the baseline's level (a slow minute): no point confirmed, inconclusive, exit 3" 3 \
  '^regress: inconclusive: 8 of 8 points read as regressions, not reproduced by the re-check .*/quiet/same-again \(a slow minute, not the fabric\); no regression in the other 0' -- \
  regress $D/quiet/base $D/quiet/slow13 --confirm $D/quiet/same-again --report-dir $tmp/rep-b2d
check "... the table says which points were not reproduced" test "$(grep -c ' not reproduced$' "$tmp/out")" -eq 8
expect "... a re-check slow in the all-reduce only: its 4 points confirmed, the all-gather's 4 not reproduced, exit 1" 1 \
  '^regress: 4 regression\(s\) in 8 points, confirmed by the re-check; 4 more not reproduced by it' -- \
  regress $D/quiet/base $D/quiet/slow13 --confirm $D/quiet/ar13-again --report-dir $tmp/rep-b2e
expect "... a re-check that is the current check itself: exit 2, one line" 2 '^regress: cannot compare: --confirm .*: holds runs of the current check itself' -- \
  regress $D/quiet/base $D/quiet/slow13 --confirm $D/quiet/slow13 --report-dir $tmp/rep-b2f
expect "quiet baseline, --threshold 0.015 below its +1.9 %: inconclusive, exit 3" 3 \
  '^regress: inconclusive: 8 of 8 points may be up to \+1\.9% slower \(threshold 1\.5%\)' -- \
  regress $D/quiet/base $D/quiet/same --threshold 0.015 --report-dir $tmp/rep-b3
expect "quiet baseline, --threshold 0.025 above it: exit 0" 0 '^regress: no regression in 8 points.*\(threshold 2\.5%' -- \
  regress $D/quiet/base $D/quiet/same --threshold 0.025 --report-dir $tmp/rep-b4
# The bound is the measured change plus the margin (+1.9 % here): "no regression" needs it
# within the threshold, whatever the margin alone. 1 % faster at a threshold of 1.5 %, below
# the margin: at most +0.9 % slower, no regression (the margin alone against the threshold,
# the rule before the bound, called it inconclusive); 1 % slower at 2.5 %, above the margin:
# may be up to +2.9 % slower, inconclusive (the margin alone passed it).
expect "quiet baseline, current 1 % faster, --threshold 0.015 below the +1.9 % margin: bound +0.9 %, exit 0" 0 \
  '^regress: no regression in 8 points; each is at most \+0\.9% slower, within the threshold \(smallest detectable \+1\.9%\) \(threshold 1\.5%' -- \
  regress $D/quiet/base $D/quiet/fast1 --threshold 0.015 --report-dir $tmp/rep-b5
expect "quiet baseline, current 1 % slower, --threshold 0.025 above the margin: bound +2.9 %, inconclusive, exit 3" 3 \
  '^regress: inconclusive: 8 of 8 points may be up to \+2\.9% slower \(threshold 2\.5%\)' -- \
  regress $D/quiet/base $D/quiet/slow1 --threshold 0.025 --report-dir $tmp/rep-b6

# --- mixed: a quiet all-reduce, a noisy all-gather ---
expect "noisy all-gather, quiet all-reduce, unchanged: 4 of 8 inconclusive, exit 3" 3 \
  '^regress: inconclusive: 4 of 8 points may be up to \+[0-9]+%.*slower \(threshold 5%\); no regression found in the other 4 \(' -- \
  regress $D/mixed/base $D/quiet/same --report-dir $tmp/rep-m1
cp "$tmp/out" "$tmp/m1.out"
check_figures "... the all-gather's figures named" "$tmp/m1.out" $tmp/rep-m1 4
check "... the inconclusive points are the all-gather's" bash -c "test \$(grep -c '^all-gather .* inconclusive\$' $tmp/m1.out) -eq 4"
expect "the all-reduce 1.3x slower: its regressions reported though the all-gather is inconclusive, exit 1" 1 \
  '^regress: 4 regression\(s\) in 8 points; 4 other point\(s\) inconclusive: may be up to \+[0-9]+%' -- \
  regress $D/mixed/base $D/mixed/ar13 --report-dir $tmp/rep-m2
cp "$tmp/out" "$tmp/m2.out"
check_figures "... the inconclusive figures named beside them" "$tmp/m2.out" $tmp/rep-m2 4

# --- (e) the history's noise model (--history): the spread between nights, not one minute ---
H=$D/hist
for name in nights calm short shortslow fresh step outlier hungry hungry-unrecorded; do
  $PY $ROOT/analysis/history.py add $H/$name.db $H/$name >"$tmp/out" 2>&1 || { bad "history add $name"; }
done
expect "a quiet-minute baseline, an unchanged check 15 % slower on a busier night: without --history a false alarm, exit 1" 1 \
  '^regress: [0-9] regression\(s\) in 8 points[; ].*spread: the baseline.s 3 back-to-back runs \(they know one minute.s spread, not the nights.: no --history\)' -- \
  regress $H/base $H/cur-busy15 --report-dir $tmp/rep-e1
expect "... with a history of nights +-20 % apart: not a regression (inconclusive), the history's 10 checks named" 3 \
  '^regress: inconclusive: 8 of 8 points .*; spread: history: 10 checks from 2026-11-02 02:00 to 2026-11-11 02:01\)' -- \
  regress $H/base $H/cur-busy15 --history $H/nights.db --report-dir $tmp/rep-e2
check "... report.md names the spread, the table its source per point" bash -c \
  "grep -q '^- spread: history: 10 checks from 2026-11-02 02:00 to 2026-11-11 02:01' $tmp/rep-e2/report.md && test \$(grep -c '| hist:10 | inconclusive |\$' $tmp/rep-e2/report.md) -eq 8"
expect "a baseline of a busy minute (runs 0.7x-1.4x: alone inconclusive, as (a)) with calm nights (+-1 %) in the history: the unchanged check passes, exit 0, the history named" 0 \
  '^regress: no regression in 8 points; .*spread: history: 10 checks from 2026-11-02 02:00 to 2026-11-11 02:01\)' -- \
  regress $H/noisybase $H/cur-same --history $H/calm.db --report-dir $tmp/rep-e4
expect "... a 30 % slowdown is caught (against the quiet minute's baseline): exit 1" 1 '^regress: 8 regression\(s\) in 8 points .*spread: history: 10 checks' -- \
  regress $H/base $H/cur-slow13 --history $H/calm.db --report-dir $tmp/rep-e5
expect "a history of 5 checks: the baseline's spread, its limit and the history's shortfall named" 3 \
  "spread: the baseline.s 3 back-to-back runs \(they know one minute.s spread, not the nights.: --history: 5 earlier check\(s\) of this configuration, 6 needed\)\)" -- \
  regress $H/noisybase $H/cur-same --history $H/short.db --report-dir $tmp/rep-e6
expect "... a 30 % slowdown against the quiet minute's baseline, the 5 short checks since it calm: a regression, exit 1" 1 \
  '^regress: 8 regression\(s\) in 8 points .*spread: the baseline.s 3 back-to-back runs .*5 earlier check\(s\)' -- \
  regress $H/base $H/cur-slow13 --history $H/short.db --report-dir $tmp/rep-e19
expect "the same check with 3 checks since the baseline as slow as it: not new (the baseline's minute is unlike them), exit 3" 3 \
  "^regress: inconclusive: 8 of 8 points slower than the baseline's runs but no slower than the 3 earlier check\(s\) since 2026-11-02 02:00 \(the baseline's minute is unlike the nights since" -- \
  regress $H/base $H/cur-slow13 --history $H/shortslow.db --report-dir $tmp/rep-e20
check "... the table says which points are not new" test "$(grep -c ' not new$' "$tmp/out")" -eq 8
expect "... a baseline recorded after those 3 checks: they do not speak for it, a regression, exit 1" 1 \
  '^regress: 8 regression\(s\) in 8 points .*3 earlier check\(s\)' -- \
  regress $H/latebase $H/cur-slow13 --history $H/shortslow.db --report-dir $tmp/rep-e21
expect "a change point in the history (8 calm checks at 1.3x, then 8 at 1.0): the spread within the levels, not across them; at 1.3x a regression against the baseline" 1 \
  '^regress: 8 regression\(s\) in 8 points .*spread: history: 16 checks from 2026-11-02 02:00 to 2026-11-17 02:01, pooled within the levels between 1 change point\(s\)\)' -- \
  regress $H/base $H/cur-slow13 --history $H/step.db --report-dir $tmp/rep-e7
expect "... back at the baseline's level: no regression, exit 0 (the spread across the step would leave it inconclusive)" 0 \
  '^regress: no regression in 8 points; .*pooled within the levels between 1 change point\(s\)\)' -- \
  regress $H/noisybase $H/cur-same --history $H/step.db --report-dir $tmp/rep-e8
expect "a slowdown 3 nights old after 8 calm nights (3 checks since its change point, too few alone): still a regression on the spread pooled within the two levels, exit 1" 1 \
  '^regress: 8 regression\(s\) in 8 points .*spread: history: 11 checks from 2026-11-02 02:00 to 2026-11-12 02:01, pooled within the levels between 1 change point\(s\)\)' -- \
  regress $H/base $H/cur-slow13 --history $H/fresh.db --report-dir $tmp/rep-e22
expect "... mended tonight (back at the baseline's level): no regression, exit 0" 0 \
  '^regress: no regression in 8 points; .*pooled within the levels between 1 change point\(s\)\)' -- \
  regress $H/base $H/cur-same --history $H/fresh.db --report-dir $tmp/rep-e23
expect "a baseline of an untypically fast minute (0.6x the nights): without --history every night a regression" 1 \
  '^regress: 8 regression\(s\) in 8 points' -- regress $H/fastbase $H/cur-same --report-dir $tmp/rep-e15
expect "... with the history: the baseline widens the spread (inconclusive, not a regression), and is named" 3 \
  '^regress: at 8 point\(s\) the baseline lies outside the history.s checks \(their median is \+6[67]% from it\)' -- \
  regress $H/fastbase $H/cur-same --history $H/calm.db --report-dir $tmp/rep-e16
check "... report.md says so" grep -q '^\*\*The baseline and the history:\*\* at 8 point(s) the baseline lies outside' $tmp/rep-e16/report.md
expect "2 checks in the history 3x slower on ranks with 5 % of a core (the baseline's 97 %): left out as starved, named; the unchanged check passes, exit 0" 0 \
  '^regress: no regression in 8 points; .*spread: history: 10 checks from 2026-11-02 02:00 to 2026-11-13 02:01, 2 check\(s\) starved of CPU left out\)' -- \
  regress $H/sharebase $H/cur-same --history $H/hungry.db --report-dir $tmp/rep-e17
expect "... the same figures without the share recorded: they count, and the check cannot pass (exit 3)" 3 \
  '^regress: inconclusive: ' -- regress $H/sharebase $H/cur-same --history $H/hungry-unrecorded.db --report-dir $tmp/rep-e18
# the current check already in the history too (as when added before the verdict): not one of its earlier checks
$PY $ROOT/analysis/history.py add $H/outlier.db $H/cur-same >/dev/null 2>&1
expect "one check 3x slower in the history, and the current one added to it: the first left out, the second not counted, exit 0" 0 \
  '^regress: no regression in 8 points; .*spread: history: 10 checks from 2026-11-02 02:00 to 2026-11-11 02:01, one outlier check left out at 8 point\(s\)\)' -- \
  regress $H/noisybase $H/cur-same --history $H/outlier.db --report-dir $tmp/rep-e9
# duplicates: a byte copy is not another run, in the baseline as in the history
mkdir -p $H/dupbase && cp $H/noisybase/*.h5 $H/dupbase/ && cp $H/noisybase/0.h5 $H/dupbase/copy-of-0.h5 &&
  cp $H/cur-same/run0.h5 $H/dupbase/cur0.h5
expect "a baseline folder with a byte copy of one of its runs and of a current run: neither counted, both named" 3 \
  "^regress: .*/dupbase/copy-of-0.h5: not counted: byte-identical to .*/dupbase/0.h5" -- regress $H/dupbase $H/cur-same --report-dir $tmp/rep-e10
cp "$tmp/out" "$tmp/e10.out"
check "... the current run's copy named, and the verdict rests on 3 baseline runs, not 5" bash -c \
  "grep -q '^regress: .*/dupbase/cur0.h5: not counted: byte-identical to .*/cur-same/run0.h5 (a current run)' $tmp/e10.out && grep -q '; 3 baseline runs, 3 current; ' $tmp/e10.out"
mkdir -p $H/twobase && cp $H/noisybase/0.h5 $H/noisybase/1.h5 $H/twobase/ && cp $H/noisybase/0.h5 $H/twobase/again.h5
expect "2 runs and a copy are not a baseline of 3: exit 2, the copy named in the reason" 2 \
  'the baseline has 2 run\(s\) of some points \(1 byte-identical file\(s\) not counted\); it needs at least 3' -- \
  regress $H/twobase $H/cur-same --report-dir $tmp/rep-e11
expect "--history that is not a history database: exit 2, one line" 2 '^regress: cannot compare: .*not a history database' -- \
  regress $H/noisybase $H/cur-same --history $H/noisybase/0.h5 --report-dir $tmp/rep-e14
check "... nothing written" test ! -e $tmp/rep-e14

# --- the help text says the exit statuses ---
regress --help >"$tmp/help.out" 2>&1
check "regress.py --help lists exit status 3 (inconclusive)" grep -qE '^ +3 +inconclusive: no regression found' "$tmp/help.out"

# --- (d) slurm/interconnect.sbatch, outside Slurm: mpirun on this machine's 2 ranks ---
if [ -x "$BIN/collective_perf" ] && command -v mpirun >/dev/null; then
  IC=$tmp/ic
  ic() { # ic VAR=VALUE...: the job with bash, all-reduce of 64 KiB, 5 iterations
    env SB_REPO="$ROOT" SB_CLUSTER=power SB_BACKEND=cpu SB_LAUNCHER=mpirun SB_SETUP=scripts/mpi-env.sh \
      SB_OPS=all-reduce SB_MIN_BYTES=64K SB_MAX_BYTES=64K SB_ITERS=5 SB_WARMUP=1 SB_RESULTS=$IC/results "$@" \
      bash "$IC_SBATCH"
  }
  expect "interconnect.sbatch: a failed collective_perf (bad -b) exits 4, not 3" 4 'collective_perf failed \(exit 2\)' -- \
    ic SB_RECORD=1 SB_BASELINE_RUNS=1 SB_BASELINE=$IC/none SB_MIN_BYTES=lots
  expect "interconnect.sbatch SB_RECORD=1: a baseline of 3 runs" 0 "=== recorded 3 runs in $IC/base" -- \
    ic SB_RECORD=1 SB_BASELINE_RUNS=3 SB_BASELINE=$IC/base
  # Its runs scaled 1/30, 1 and 30: no slowdown this machine could show can be told from that spread.
  $PY - $IC/base <<'PYEOF' >"$tmp/out" 2>&1
import glob, os, sys, h5py
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.h5")))
assert len(files) == 3, files
for f, factor in zip(files, [1 / 30, 1.0, 30.0]):
    with h5py.File(f, "r+") as h:
        s = h["samples"][()]
        s["time"] *= factor
        h["samples"][...] = s
PYEOF
  expect "interconnect.sbatch against a baseline spread 1/30x-30x: regress's exit 3 passes through, INCONCLUSIVE line" 3 \
    "^=== interconnect power: INCONCLUSIVE: 2 of 2 points may be up to .* slower \(threshold 5%\); no regression found; .*SB_BASELINE_RUNS.*\(report: $IC/results/collectives-[^ ]*-report/report.md\)" -- \
    ic SB_RUNS=1 SB_BASELINE=$IC/base
  report=$(sed -n 's/^=== interconnect power: INCONCLUSIVE: .*(report: \(.*\))$/\1/p' "$tmp/out")
  check "... the report it names exists and says inconclusive" grep -q '^\*\*inconclusive: 2 of 2 points' "${report:-/dev/null}"
  expect "interconnect.sbatch again: the history it kept (SB_HISTORY) reaches regress.py, its shortfall named" 3 \
    "spread: the baseline.s 3 back-to-back runs \(they know one minute.s spread, not the nights.: --history: 1 earlier check\(s\) of this configuration, 6 needed\)" -- \
    ic SB_RUNS=1 SB_BASELINE=$IC/base
else
  echo "  (interconnect.sbatch not checked: $BIN/collective_perf or mpirun missing)"
fi

summary
