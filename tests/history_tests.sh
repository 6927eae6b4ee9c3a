#!/usr/bin/env bash
# analysis/history.py, the history of the interconnect checks: E-Divisive means checked on
# numpy arrays; then histories built from the 20 recorded collective_perf runs of
# tests/data/regress (copies with their iteration times scaled from run K on, distinct start
# times, commits and hosts): the change is found at K (within one run) and nowhere else, on
# quiet runs (a few % of spread and 2-5x outlier iterations, as an emulated cluster) and on
# the recorded ones (up to 25x spread); none is found without a change, over several
# orders; a single run 3x slower is no change point; add is idempotent and all or nothing;
# bad input is one line, exit 2, the DB unchanged; --openmetrics parses, --plot is a PNG.
# Ends with "N passed, M failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
HIST=${HIST:-$ROOT/analysis/history.py}  # HIST=path tests another copy (an older one must fail)
DATA=$ROOT/tests/data/regress
MAKE=$tmp/make_runs.py

cat >"$MAKE" <<'PYEOF'
"""make_runs.py OUT N [--k K --factor F] [--point OP:IN_PLACE:SIZE] [--outlier I] [--mode M] [--seed S]
OUT/rNN.h5: N copies of recorded collective_perf runs, an hour apart (start_time), commit
cNN, hosts nodeA,nodeB (nodeA,nodeC from run K on when F != 1); iteration times (and the
results table) times F from run K on (only the --point's when given), times 3 for run I.
quiet: copies of run00.h5, times x a run's factor (3 % spread) x a sample's (5 %), 3 % of
samples 2-5x; real: the 20 recorded runs in an order drawn with the seed."""
import argparse, datetime, glob, os, shutil
import h5py, numpy as np
ap = argparse.ArgumentParser()
ap.add_argument("out"); ap.add_argument("n", type=int); ap.add_argument("--data", required=True)
ap.add_argument("--k", type=int, default=-1); ap.add_argument("--factor", type=float, default=1.0)
ap.add_argument("--point"); ap.add_argument("--outlier", type=int, default=-1)
ap.add_argument("--mode", default="quiet"); ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
rng = np.random.default_rng(a.seed)
real = sorted(glob.glob(os.path.join(a.data, "run*.h5")))
order = rng.permutation(len(real)) if a.mode == "real" else np.zeros(a.n, int)
os.makedirs(a.out, exist_ok=True)
t0 = datetime.datetime(2026, 12, 1)
for i in range(a.n):
    dst = os.path.join(a.out, f"r{i:02d}.h5")
    shutil.copyfile(real[order[i]], dst)
    with h5py.File(dst, "r+") as f:
        names = [x.decode() if isinstance(x, bytes) else str(x) for x in f["samples"].attrs["op_names"]]
        s, r = f["samples"][()], f["results"][()]

        def sel(t):
            if not a.point:
                return np.ones(len(t), bool)
            op, place, size = a.point.split(":")
            return (t["op"] == names.index(op)) & (t["in_place"] == int(place)) & (t["size"] == int(size))
        scale = np.ones(len(s))
        if 0 <= a.k <= i:
            scale[sel(s)] *= a.factor
        if i == a.outlier:
            scale *= 3.0
        if a.mode == "quiet":
            scale *= np.exp(rng.normal(0, 0.03)) * np.exp(rng.normal(0, 0.05, len(s)))
            hit = rng.random(len(s)) < 0.03
            scale[hit] *= rng.uniform(2, 5, hit.sum())
        s["time"] *= scale
        f["samples"][...] = s
        g = np.ones(len(r)) * float(np.median(scale))
        if 0 <= a.k <= i and a.point:
            g[~sel(r)] = 1.0
        r["time"] *= g; r["algbw"] /= g; r["busbw"] /= g
        f["results"][...] = r
        start = t0 + datetime.timedelta(hours=i)
        f.attrs["start_time"] = start.strftime("%Y-%m-%dT%H:%M:%SZ")
        f.attrs["end_time"] = (start + datetime.timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
        f["provenance"].attrs["shardbench_version"] = f"c{i:02d}"
        ranks = f["provenance/ranks"][()]
        ranks["host"] = [b"nodeA", b"nodeC" if 0 <= a.k <= i and a.factor != 1 else b"nodeB"]
        f["provenance/ranks"][...] = ranks
PYEOF

# history NAME DIR [make_runs args...]: a fresh DB of DIR's runs ($tmp/NAME.db).
history() {
  local name=$1
  shift
  rm -rf "$tmp/$name" "$tmp/$name.db"
  $PY "$MAKE" "$tmp/$name" --data "$DATA" "$@" >"$tmp/out" 2>&1 && $PY $HIST add "$tmp/$name.db" "$tmp/$name" >>"$tmp/out" 2>&1
}

# changes_at NAME K: show exits 1, and every "first run after a change" is run K or a
# neighbour (at least one); K empty: exit 0, no change point.
changes_at() {
  local name=$1 k=$2 rc runs r
  $PY $HIST show "$tmp/$name.db" >"$tmp/$name.out" 2>&1
  rc=$?
  cat "$tmp/$name.out"
  runs=$(sed -n 's/^  first run after a change: .*\/r\([0-9][0-9]\)\.h5 (.*/\1/p' "$tmp/$name.out" | sed 's/^0//')
  if [ -z "$k" ]; then
    [ "$rc" -eq 0 ] && [ -z "$runs" ] && grep -q '^history: no change point' "$tmp/$name.out"
    return
  fi
  [ "$rc" -eq 1 ] && [ -n "$runs" ] || { echo "exit $rc, changes at: ${runs:-none}"; return 1; }
  for r in $runs; do
    [ $((r - k)) -ge -1 ] && [ $((r - k)) -le 1 ] || { echo "change at run $r, not $k"; return 1; }
  done
}

# --- E-Divisive means on numpy arrays ---
expect "E-Divisive: the statistic, steps, outliers, no false alarm on noise, multivariate" 0 '^ok ' -- \
  $PY - "$ROOT/analysis" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from stats import distances, e_divisive, energy, prune, steps_at
rng = np.random.default_rng(7)
# energy() is Matteson & James' Q for every split, against its definition written out
x = rng.normal(size=12)
tau, q = energy(distances(x), 2)
for t, qt in zip(tau, q):
    a, b = x[:t], x[t:]
    between = np.abs(a[:, None] - b[None, :]).mean()
    within_a = np.abs(a[:, None] - a[None, :]).sum() / (t * (t - 1))
    within_b = np.abs(b[:, None] - b[None, :]).sum() / ((12 - t) * (11 - t))
    assert abs(qt - t * (12 - t) / 12 * (2 * between - within_a - within_b)) < 1e-9, (t, qt)
# and for a batch of permuted matrices at once
d = distances(x)
idx = np.array([rng.permutation(12) for _ in range(5)])
batch = energy(d[idx[:, :, None], idx[:, None, :]], 3)[1]
for i in range(5):
    assert np.allclose(batch[i], energy(distances(x[idx[i]]), 3)[1])
step = np.r_[rng.normal(0, 0.05, 10), rng.normal(0.3, 0.05, 10)]
assert [t for t, _ in e_divisive(step, 0.01)] == [10]
two = np.r_[rng.normal(0, 0.05, 10), rng.normal(0.3, 0.05, 10), rng.normal(-0.2, 0.05, 10)]
assert [t for t, _ in e_divisive(two, 0.01)] == [10, 20]
assert e_divisive(step, 0.01, seed=3) == e_divisive(step, 0.01, seed=3)  # a fixed seed: the same answer
for at in (0, 1, 7, 18, 19):  # one value far off is no change point, wherever it is
    one = rng.normal(0, 0.05, 20)
    one[at] += np.log(3)
    assert e_divisive(one, 0.01) == [], at
alarms = sum(bool(e_divisive(rng.normal(size=30), 0.01, seed=s)) for s in range(40))
assert alarms <= 2, alarms  # level 0.01: 0.4 expected in 40 series
heavy = sum(bool(e_divisive(rng.standard_t(2, size=20), 0.01, seed=s)) for s in range(20))
assert heavy <= 1, heavy  # heavy tails (Student's t, 2 dof)
edge = np.r_[rng.normal(0, 0.05, 3), rng.normal(0.3, 0.05, 13)]  # 3 + 13 runs: the minimum segment
assert [t for t, _ in e_divisive(edge, 0.01)] == [3]
multi = np.c_[rng.normal(0, 0.05, 20), np.r_[rng.normal(0, 0.05, 12), rng.normal(0.4, 0.05, 8)]]
assert [t for t, _ in e_divisive(multi, 0.01)] == [12]
# the search goes on from given change points, and a step under the minimum is dropped
assert [t for t, _ in e_divisive(two, 0.01, given=[10])] == [20]
times = np.exp(np.r_[np.zeros(10), np.full(10, 0.02)])
assert prune([(10, 0.001)], lambda c: [s[0] for s in steps_at(times, c)], 0.05) == []
assert prune([(10, 0.001)], lambda c: [s[0] for s in steps_at(times, c)], 0.01) == [(10, 0.001)]
print("ok", alarms, heavy)
PYEOF

# --- the spread of the checks, robust to outliers (stats.spread_outliers_out) ---
expect "spread_outliers_out: two alike outliers both left out (masking), none in normal samples, one at most in 19" 0 '^ok ' -- \
  $PY - "$ROOT/analysis" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from stats import spread_outliers_out
rng = np.random.default_rng(11)
x = rng.normal(0, 0.01, 30)
x[[4, 17]] = [0.045, 0.047]  # two slow minutes of +4.5 %, the others' 1 %
sd, dof, left = spread_outliers_out(x)
assert left == [4, 17], left  # the first step alone (one outlier at most) masks them
assert dof == 27 and abs(sd - np.std(np.delete(x, [4, 17]), ddof=1)) < 1e-12, (sd, dof)
assert spread_outliers_out(x, most=1)[2] == [], "one step alone should be masked by the other outlier"
wrong = sum(len(spread_outliers_out(rng.normal(0, 0.01, 30))[2]) for _ in range(200))
assert wrong <= 2, wrong  # level 0.001, up to 3 steps: under 0.6 expected in 200 samples
small = rng.normal(0, 0.01, 19)
small[[2, 9]] = [0.06, 0.05]
assert len(spread_outliers_out(small)[2]) <= 1  # a tenth of 19: one at most
assert spread_outliers_out(rng.normal(0, 0.01, 3))[2] == []  # too few to judge
print("ok", wrong)
PYEOF

# --- the recorded runs: add, idempotent, no change in their own order ---
DB=$tmp/real.db
expect "add: 20 recorded runs indexed" 0 'added 20 run\(s\), 0 already indexed; it holds 20 run\(s\)' -- \
  $PY $HIST add $DB $DATA
sha=$(sha256sum $DB)
expect "add again: nothing added (keyed on the file's content)" 0 'added 0 run\(s\), 20 already indexed; it holds 20' -- \
  $PY $HIST add $DB $DATA
cp $tmp/out $tmp/add2.out
cp $DATA/run07.h5 $tmp/copy-of-run07.h5
expect "add a byte copy under another name: nothing added" 0 'added 0 run\(s\), 1 already indexed' -- \
  $PY $HIST add $DB $tmp/copy-of-run07.h5
check "... the DB unchanged by both, and the answer ends with the next command" bash -c \
  "[ \"\$(sha256sum $DB)\" = '$sha' ] && tail -n 1 $tmp/add2.out | grep -q '^next: analysis/history.py show '"
expect "show: no change point in the recorded order (20 runs, 8 series)" 0 \
  '^history: no change point in 8 series over 20 run\(s\)' -- $PY $HIST show $DB
cp $tmp/out $tmp/show.out
check "... it says regress.py's verdict is separate and ends with the next command" bash -c \
  "grep -q 'analysis/regress.py judges the latest runs against a baseline' $tmp/show.out && tail -n 1 $tmp/show.out | grep -q '^next: analysis/regress.py '"
expect "show --op all-reduce --size 64K: one series" 0 '^all-reduce +out +65536 .* 20 .*none$' -- \
  $PY $HIST show $DB --op all-reduce --size 64K

# --- a change from run K on is found at K (+-1) and nowhere else ---
for spec in "3 1.5 1" "8 1.5 2" "12 1.2 3"; do
  set -- $spec
  history step$1 16 --k $1 --factor $2 --seed $3
  check "quiet runs, x$2 from run $1 of 16: found at $1 (+-1), nowhere else" changes_at step$1 $1
done
check "... names the first run after it: its date, commit and nodes, and the step" grep -qE \
  '^  first run after a change: 2026-12-01T08:00:00Z, commit c08, nodes nodeA,nodeC: .*/r08.h5 \(8 of 8 series, median step of the time \+[45][0-9]\.[0-9]%\)' \
  $tmp/step8.out
check "... every series' step, as time and busbw" grep -qE \
  '^    all-reduce out-of-place 262144 B: run 9 of 16: time \+[45][0-9]\.[0-9]%, busbw -[23][0-9]\.[0-9]% \(median ' \
  $tmp/step8.out
for spec in "8 3 5" "11 2 6"; do
  set -- $spec
  history real$1 16 --mode real --k $1 --factor $2 --seed $3
  check "recorded runs (up to 25x spread) in a drawn order, x$2 from run $1: found at $1 (+-1), nowhere else" \
    changes_at real$1 $1
done
history one 20 --k 10 --factor 1.5 --point all-reduce:0:262144 --seed 7
one_alone() {
  changes_at one 10 && grep -q '(1 of 8 series' $tmp/one.out &&
    grep -q '^    all-reduce out-of-place 262144 B: run 11 of 20' $tmp/one.out
}
check "one series alone x1.5 from run 10 of 20: found there, in that series only" one_alone

# --- no change: none found, over several orders and seeds; a single slow run is no change ---
for seed in 1 2; do
  history null$seed $((15 + seed)) --seed $seed
  check "quiet runs without a change ($((15 + seed)) runs, seed $seed): no change point" changes_at null$seed ""
done
for seed in 4 5 6; do
  history rnull$seed $((14 + seed)) --mode real --seed $seed
  check "recorded runs in a drawn order ($((14 + seed)) runs, seed $seed): no change point" changes_at rnull$seed ""
done
for at in 5 15; do
  history out$at 16 --outlier $at --seed $((10 + at))
  check "quiet runs, run $at of 16 once 3x slower: no change point" changes_at out$at ""
done
history rout 18 --mode real --outlier 9 --seed 8
check "recorded runs, run 9 once 3x slower: no change point" changes_at rout ""

# --- filters, the plot, the OpenMetrics file ---
expect "--since the change: no change point in the runs after it" 0 '^history: no change point in 8 series over 8 run\(s\)' -- \
  $PY $HIST show $tmp/step8.db --since 2026-12-01T08:00:00Z
expect "--last 12 of 16 runs (change at 8): still found" 1 '^history: 8 change point\(s\) in 8 of 8 series over 12 run\(s\)' -- \
  $PY $HIST show $tmp/step8.db --last 12
expect "--plot and --openmetrics" 1 'wrote .*m\.prom' -- \
  $PY $HIST show $tmp/step8.db --plot $tmp/h.png --openmetrics $tmp/m.prom
check "... the plot is a PNG" bash -c "head -c 8 $tmp/h.png | od -An -tx1 | grep -q '89 50 4e 47 0d 0a 1a 0a'"
expect "... the OpenMetrics file parses (HELP, TYPE gauge, name{labels} value) and is complete" 0 '^ok 48$' -- \
  $PY - $tmp/m.prom <<'PYEOF'
import datetime, re, sys, os
text = open(sys.argv[1]).read()
assert not os.path.exists(sys.argv[1] + ".tmp")
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(' + label + r'(?:,' + label + r')*)\} (\S+)$')
typed, helped, n = {}, set(), 0
for line in text.splitlines():
    if line.startswith("# HELP "):
        helped.add(line.split()[2])
    elif line.startswith("# TYPE "):
        _, _, name, kind = line.split()
        typed[name] = kind
    else:
        m = sample.match(line)
        assert m, line
        assert m.group(1) in typed and m.group(1) in helped, line
        float(m.group(3))
        n += 1
assert all(k == "gauge" for k in typed.values())
busbw = [l for l in text.splitlines() if l.startswith("shardbench_interconnect_busbw_gbps{")]
assert any('op="all-reduce",size="262144",placement="out"' in l for l in busbw), busbw
last = datetime.datetime(2026, 12, 1, 15, tzinfo=datetime.timezone.utc).timestamp()  # r15's start
stamps = [l for l in text.splitlines() if l.startswith("shardbench_interconnect_run_timestamp_seconds{")]
assert len(stamps) == 8 and all(float(l.split()[-1]) == last for l in stamps), stamps
changes = [l for l in text.splitlines() if l.startswith("shardbench_interconnect_change_points{")]
assert len(changes) == 8 and all(l.endswith(" 1") for l in changes), changes
print("ok", n)
PYEOF

# --- show's files are written whole or not at all (cli.Outputs), on a disk that fills up ---
# A tmpfs with room for the plot but not the OpenMetrics file beside it: exit 2 naming the file,
# and neither left (a plot of this run beside the last run's .prom would be two nights mixed),
# nor any temporary. Then too small for the plot: the same. (root: mounts a tmpfs)
disk=$tmp/disk
mkdir -p $disk
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=1M tmpfs $disk 2>/dev/null; then
  png=$(stat -c %s $tmp/h.png) prom=$(stat -c %s $tmp/m.prom)
  # pages (4 KiB) free: the plot's and one more (the .prom needs $prom bytes); then half the plot's
  for room in $(((png / 4096 + 2) * 4096)) $((png / 2)); do
    rm -f $disk/filler
    avail=$(($(stat -f -c '%a * %S' $disk)))
    head -c $((avail - room)) /dev/zero >$disk/filler
    expect "show --plot --openmetrics, $room bytes free (plot $png, .prom $prom): exit 2, the file named" 2 \
      "^history: error: cannot write '$disk/(h.png|m.prom)': No space left on device" -- \
      $PY $HIST show $tmp/step8.db --plot $disk/h.png --openmetrics $disk/m.prom
    check "... nothing of it left: no plot, no .prom, no temporary" bash -c "[ \"\$(ls -A $disk)\" = filler ]"
  done
  umount $disk
else
  echo "  (the full-disk check needs root and a tmpfs: not run)"
fi

# --- a run whose data check failed: indexed, left out of the trends ---
cp $tmp/null1/r05.h5 $tmp/failed.h5
$PY -c "import h5py; h5py.File('$tmp/failed.h5', 'r+').attrs['status'] = 'failed'"
expect "a run with status failed is indexed" 0 'added 1 run\(s\)' -- $PY $HIST add $tmp/null1.db $tmp/failed.h5
expect "... and left out of the trends" 0 '; 1 run\(s\) with a failed data check left out' -- \
  $PY $HIST show $tmp/null1.db

# --- bad input: one line, exit 2, the DB unchanged, nothing written ---
echo "not HDF5" >$tmp/notes.h5
$PY -c "import h5py; f = h5py.File('$tmp/ddp.h5', 'w'); f.attrs['program'] = 'ddp_perf'"
cp $DATA/run01.h5 $tmp/nosamples.h5
$PY -c "import h5py; del h5py.File('$tmp/nosamples.h5', 'r+')['samples']"
cp $DATA/run02.h5 $tmp/nan.h5
$PY -c "
import h5py, numpy as np
f = h5py.File('$tmp/nan.h5', 'r+'); s = f['samples'][()]; s['time'][3] = np.nan; f['samples'][...] = s"
mkdir -p $tmp/empty
sha=$(sha256sum $DB)
one_line() {  # one_line NAME CODE PATTERN -- command: exit CODE, exactly one line, matching PATTERN
  local name=$1 code=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -eq "$code" ] && [ "$(wc -l <"$tmp/out")" -eq 1 ] && grep -qE -- "$pattern" "$tmp/out"; then
    ok "$name"
  else
    echo "      exit $rc, expected $code; one line matching /$pattern/" >>"$tmp/out"
    bad "$name"
  fi
}
one_line "add: not an HDF5 file" 2 '^history: error: .*notes.h5: not a readable HDF5 file' -- \
  $PY $HIST add $DB $DATA/run00.h5 $tmp/notes.h5
one_line "add: not a collective_perf result" 2 "^history: error: .*ddp.h5: not a collective_perf result \(program 'ddp_perf'\)" -- \
  $PY $HIST add $DB $tmp/ddp.h5
one_line "add: no samples table" 2 '^history: error: .*nosamples.h5: no samples table' -- $PY $HIST add $DB $tmp/nosamples.h5
one_line "add: a non-finite time" 2 '^history: error: .*nan.h5: 1 of 320 times are not finite positive numbers' -- \
  $PY $HIST add $DB $tmp/nan.h5
one_line "add: a folder without results" 2 '^history: error: .*empty: no .h5 results' -- $PY $HIST add $DB $tmp/empty
one_line "add: no such file" 2 '^history: error: .*nosuch.h5: no such file or directory' -- $PY $HIST add $DB $tmp/nosuch.h5
one_line "add: a DB that is not a history database" 2 '^history: error: .*copy-of-run07.h5: not a history database' -- \
  $PY $HIST add $tmp/copy-of-run07.h5 $DATA/run00.h5
check "... after all of these the DB is unchanged" bash -c "[ \"\$(sha256sum $DB)\" = '$sha' ]"
one_line "add to a new DB with one bad file: no DB created" 2 'notes.h5: not a readable HDF5 file' -- \
  $PY $HIST add $tmp/new.db $DATA/run00.h5 $tmp/notes.h5
check "... no DB file left" test ! -e $tmp/new.db
one_line "show: no such DB (none created)" 2 '^history: error: .*missing.db: no such history database' -- \
  $PY $HIST show $tmp/missing.db
check "... none created" test ! -e $tmp/missing.db
one_line "show --size abc" 2 "^history: error: --size 'abc' is not a size in bytes" -- $PY $HIST show $DB --size abc
one_line "show --size 1M: a size not held" 2 '^history: error: .*no runs at 1048576 B \(sizes held: 65536, 262144\)' -- \
  $PY $HIST show $DB --size 1M
one_line "show --op broadcast: an operation not held" 2 "^history: error: --op 'broadcast': no runs of it" -- \
  $PY $HIST show $DB --op broadcast
one_line "show --since yesterday" 2 "^history: error: --since 'yesterday' is not an ISO 8601 date" -- \
  $PY $HIST show $DB --since yesterday
one_line "show --plot into a missing folder (checked before any work)" 2 "^history: error: --plot '.*': directory" -- \
  $PY $HIST show $DB --plot $tmp/nodir/h.png --openmetrics $tmp/m2.prom
check "... nothing written" test ! -e $tmp/m2.prom
one_line "show --plot x.jpg" 2 "^history: error: --plot '.*x.jpg': the file name must end in one of .png" -- \
  $PY $HIST show $DB --plot $tmp/x.jpg
one_line "show: a DB that is not SQLite" 2 '^history: error: .*notes.h5: not a history database' -- $PY $HIST show $tmp/notes.h5
check "... and the DB is still unchanged" bash -c "[ \"\$(sha256sum $DB)\" = '$sha' ]"

summary
