#!/usr/bin/env bash
# collective_perf on 2 and 4 ranks: the bus-bandwidth arithmetic and the HDF5 contents
# (recomputed in Python from the raw samples), the data check (including a corrupted
# result being caught), the bandwidth floor, bad input, and analysis/regress.py on recorded
# runs: identical back-to-back runs raise no alarm (inconclusive, exit 3, on this VM's noisy
# runs), injected slowdowns are flagged, damaged input exits 2 (its power on noisy and quiet
# baselines: tests/regress_power_tests.sh). Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/lib.sh"
CP=$BIN/collective_perf
MPI2=(timeout 300 mpirun -np 2 --bind-to none)
MPI4=(timeout 300 mpirun -np 4 --oversubscribe --bind-to none)
SMALL=(-b 1K -e 64K -f 8 -n 5 -w 1)
R=$tmp/results B=$tmp/bad
mkdir -p "$R" "$B"

# --- every operation, both placements, data checked; arithmetic rechecked from samples ---
expect "2 ranks: every operation, data checked" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP --ops all "${SMALL[@]}" --out $R/all2.h5
expect "hybrid without --shard-size: one node's ranks (4)" 0 '# hybrid: reduce-scatter in shard groups of 4, all-reduce across 1 groups' -- \
  "${MPI4[@]}" $CP --ops hybrid "${SMALL[@]}" --out $R/hybrid-node.h5
expect "4 ranks: every operation and hybrid, -a 3 (max)" 0 'Out of bounds values : 0 OK' -- \
  "${MPI4[@]}" $CP --ops all,hybrid --shard-size 2 "${SMALL[@]}" -a 3 --out $R/all4.h5
expect "4 ranks: -a 0 (rank 0), -z 1 (a barrier after each operation)" 0 'time across ranks: rank0' -- \
  "${MPI4[@]}" $CP --ops all-reduce,reduce-scatter "${SMALL[@]}" -a 0 -z 1 --out $R/a0.h5
expect "busbw, algbw, times, percentiles recomputed from the samples (2 ranks)" 0 '^ok .*all2.h5' -- \
  $PY $ROOT/tests/check_collectives.py --ranks 2 $R/all2.h5
expect "the same for the 4-rank files" 0 '^ok .*a0.h5' -- $PY $ROOT/tests/check_collectives.py --ranks 4 $R/all4.h5 $R/a0.h5
expect "the recheck fails on a wrong rank count" 1 'FAIL' -- $PY $ROOT/tests/check_collectives.py --ranks 3 $R/all2.h5
expect "nccl-tests table layout" 0 '#wrong +time +algbw +busbw #wrong' -- "${MPI2[@]}" $CP "${SMALL[@]}" --out $R/t.h5
# bfloat16 and half reduce through user-defined MPI operations (fp32 math, rounded).
for spec in "double max" "int32 avg" "int64 prod" "uint8 sum" "float min" "bfloat16 sum" "half avg" "bfloat16 max" \
  "half prod"; do
  set -- $spec
  expect "4 ranks: $1 $2 (all-reduce, reduce-scatter, reduce, hybrid)" 0 'Out of bounds values : 0 OK' -- \
    "${MPI4[@]}" $CP --ops all-reduce,reduce-scatter,reduce,hybrid --shard-size 2 -d $1 -o $2 "${SMALL[@]}" \
    --out $R/$1-$2.h5
done
expect "bfloat16 moves (all-gather, broadcast, all-to-all, send-recv)" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP --ops all-gather,broadcast,all-to-all,send-recv -d bfloat16 "${SMALL[@]}" --out $R/bf16.h5
expect "a corrupted bfloat16 sum is caught" 4 'Out of bounds values : [1-9][0-9]* FAILED' -- \
  "${MPI2[@]}" $CP --ops all-reduce -d bfloat16 "${SMALL[@]}" --inject-error 0 --out $R/bad-bf16.h5

# --- --groups: every group of one axis of the layout at once (a hybrid run's groups) ---
for axis in replicate shard; do
  expect "--groups $axis on 4 ranks (shard groups of 2): 2 groups of 2 at once, every operation data-checked" 0 \
    "# groups: $axis, 2 groups of 2 ranks \\(1 node each\\) at once" -- \
    "${MPI4[@]}" $CP --ops all --groups $axis --shard-size 2 "${SMALL[@]}" --out $R/groups-$axis.h5
  cp "$tmp/out" "$tmp/groups-$axis.out"
  check "... its table says no element was wrong" grep -q 'Out of bounds values : 0 OK' "$tmp/groups-$axis.out"
done
expect "... the result records the groups; a row is one group's: all-reduce busbw = algbw (2 ranks), all-gather's half" 0 \
  '^replicate 2 1 4 ok$' -- $PY -c "
import h5py, numpy as np
f = h5py.File('$R/groups-replicate.h5'); a = f.attrs; r = f['results'][()]
names = list(f['results'].attrs['op_names'])
ar, ag = r[r['op'] == names.index('all-reduce')], r[r['op'] == names.index('all-gather')]
ok = np.allclose(ar['busbw'], ar['algbw']) and np.allclose(ag['busbw'], ag['algbw'] / 2) and len(ar) and len(ag)
print(a['groups'], a['group_size'], a['group_nodes'], a['world_size'], 'ok' if ok else 'WRONG')"
expect "a corrupted element in one group is caught" 4 'Out of bounds values : [1-9][0-9]* FAILED' -- \
  "${MPI4[@]}" $CP --ops all-reduce --groups replicate --shard-size 2 "${SMALL[@]}" --inject-error 3 --out $R/groups-bad.h5
expect "--groups: a root beyond a group's ranks" 2 "-r 2 is not allowed with --groups replicate \\(a group has 2 ranks: roots 0..1\\)" -- \
  "${MPI4[@]}" $CP --ops broadcast --groups replicate --shard-size 2 -r 2 --out $B/x.h5
expect "--groups with the hybrid operation" 2 "--groups is not allowed with the hybrid operation" -- \
  "${MPI4[@]}" $CP --ops hybrid --groups shard --out $B/x.h5
expect "--groups of an unknown axis" 2 "--groups: tensor not in \\{replicate,shard\\}" -- \
  "${MPI2[@]}" $CP --groups tensor --out $B/x.h5

# --- blocking (default) and non-blocking collectives ---
expect "the header says the blocking collectives ran" 0 '# collectives: blocking' -- \
  "${MPI2[@]}" $CP --ops all-reduce,reduce-scatter "${SMALL[@]}" --out $R/blk.h5
expect "--nonblocking: the header says so, data checked" 0 '# collectives: nonblocking' -- \
  "${MPI2[@]}" $CP --ops all-reduce,all-gather,reduce-scatter,hybrid --shard-size 2 "${SMALL[@]}" --nonblocking \
  --out $R/nb.h5
expect "the HDF5 result names the path" 0 'blocking nonblocking' -- \
  $PY -c "import h5py; print(*[h5py.File('$R/' + x)['/'].attrs['collectives'] for x in ('blk.h5', 'nb.h5')])"

# --- nccl-tests command lines ---
expect "nccl-tests line: -b 8 -e 128M -f 2 -g 1" 0 '^ +134217728 +33554432 +float' -- \
  "${MPI2[@]}" $CP -b 8 -e 128M -f 2 -g 1 -n 1 -w 0 -c 0 --out $R/ncclline.h5
expect "-t 1 -g 1 -p 1 -y 0 -G 0 -R 0 -D 0 -V 16 (their off values) are accepted" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP -t 1 -g 1 -p 1 -y 0 -G 0 -R 0 -D 0 -V 16 "${SMALL[@]}" --out $R/off.h5
for flag in "-g 2" "-t 4"; do
  expect "$flag: one line saying it does not apply, exit 2" 2 "^.*: error: $flag does not apply: collective_perf runs one rank per device" -- \
    "${MPI2[@]}" $CP $flag "${SMALL[@]}" --out $B/x.h5
done
for flag in "-y 1" "-G 2" "-R 1" "-D 1" "-x 0"; do
  expect "$flag does not apply here: exit 2" 2 "$flag does not apply" -- "${MPI2[@]}" $CP $flag "${SMALL[@]}" --out $B/x.h5
done
expect "-d all -o all -r all: every type, reduction and root, checked" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP --ops all-reduce,reduce,broadcast -d all -o all -r all -b 64 -e 1K -f 4 -n 2 -w 0 -c 2 \
  --out $R/every.h5
expect "... 7 types x 5 reductions x 2 roots of reduce, 7 x 2 roots of broadcast (python)" 0 'ok 7 5 2 119' -- $PY -c "
import h5py, numpy as np
r = h5py.File('$R/every.h5')['results'][()]
print('ok', len(np.unique(r['dtype'])), len(np.unique(r['redop'])), len(np.unique(r['root'])), len(r) // 6)"
expect "... and the rows recheck from the samples" 0 '^ok .*every.h5' -- $PY $ROOT/tests/check_collectives.py --ranks 2 $R/every.h5
expect "-i 3K: sizes step by a fixed increment" 0 '^ +7168 +1792 +float' -- \
  "${MPI2[@]}" $CP -b 1K -e 8K -i 3K -n 2 -w 0 --out $R/step.h5 -J $R/step.json
expect "-J writes the table as JSON" 0 'ok \[1024, 4096, 7168\]' -- $PY -c "
import json; d = json.load(open('$R/step.json')); print('ok', sorted({r['size'] for r in d['results']}))"
expect "-m 4 -z 3 -N 2: aggregated operations, two cycles" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP "${SMALL[@]}" -m 4 -z 3 -N 2 --nonblocking --out $R/agg.h5
expect "... both cycles recorded" 0 'ok \[0, 1\]' -- \
  $PY -c "import h5py, numpy as np; print('ok', sorted(np.unique(h5py.File('$R/agg.h5')['results']['cycle']).tolist()))"
expect "... the rows recheck per cycle" 0 '^ok .*agg.h5' -- $PY $ROOT/tests/check_collectives.py --ranks 2 $R/agg.h5
expect "-m 4 blocking, -u 3 (misaligned buffers), checked" 0 'Out of bounds values : 0 OK' -- \
  "${MPI2[@]}" $CP --ops all "${SMALL[@]}" -m 4 -u 3 -d half --out $R/unalign.h5
expect "-I 1 -K 1 -S 1 -C 1 -M 1: per-iteration columns, timestamps, memory" 0 \
  'i_max.*i_max' -- "${MPI2[@]}" $CP "${SMALL[@]}" -I 1 -K 1 -S 1 -C 1 -M 1 --out $R/extra.h5
if grep -qE '^ +65536 .* 20[0-9]{2}-[0-9]{2}-[0-9]{2} [0-9:]{8}$' "$tmp/out" && grep -q '^# Memory (max over ranks): buffers' "$tmp/out"; then
  ok "... rows end with a timestamp; the memory line is printed"; else bad "... rows end with a timestamp; the memory line is printed"; fi
expect "-c 0: no check (#wrong 0), -c 3: three checked iterations find 3x the corruption" 0 'ok 0 3' -- bash -c "
  ${MPI2[*]} $CP -b 1K -e 1K -n 1 -w 0 -c 1 --inject-error 0 --out $R/c1.h5 >/dev/null
  ${MPI2[*]} $CP -b 1K -e 1K -n 1 -w 0 -c 3 --inject-error 0 --out $R/c3.h5 >/dev/null
  ${MPI2[*]} $CP -b 1K -e 1K -n 1 -w 0 -c 0 --inject-error 0 --out $R/c0.h5 >/dev/null
  $PY -c \"import h5py; w = lambda x: h5py.File('$R/' + x)['/'].attrs['wrong_total']; print('ok', w('c0.h5'), w('c3.h5') // w('c1.h5'))\""
expect "-T 1: a size that runs longer fails (exit 1), no result file" 1 'ran longer than -T 1 s; aborting' -- \
  "${MPI2[@]}" $CP -T 1 -b 64M -e 64M -n 100000 -w 0 -c 0 --out $R/timeout.h5
if [ -e $R/timeout.h5 ]; then bad "-T: no result file"; else ok "-T: no result file"; fi

# --- a corrupted result is caught ---
expect "corrupted element on rank 1: #wrong counted, exit 4" 4 'Out of bounds values : [1-9][0-9]* FAILED' -- \
  "${MPI4[@]}" $CP --ops all-reduce,all-gather "${SMALL[@]}" --inject-error 1 --out $R/bad.h5
expect "the corrupted run is recorded as failed" 0 'failed' -- \
  $PY -c "import h5py; print(h5py.File('$R/bad.h5')['/'].attrs['status'])"

# --- the bandwidth floor ---
expect "--min-busbw above the achieved bandwidth: exit 5" 5 'below the floor' -- \
  "${MPI2[@]}" $CP "${SMALL[@]}" --min-busbw 100000 --out $R/floor.h5
expect "SHARDBENCH_MIN_BUSBW does the same" 5 'below the floor' -- \
  env SHARDBENCH_MIN_BUSBW=100000 "${MPI2[@]}" -x SHARDBENCH_MIN_BUSBW $CP "${SMALL[@]}" --out $R/floor2.h5
expect "a floor that is met passes" 0 'Bus bandwidth floor .* OK' -- \
  "${MPI2[@]}" $CP "${SMALL[@]}" --min-busbw 0.000001 --out $R/floor3.h5

# --- bad input: one line, exit 2, nothing written ---
expect "min size above max" 2 "-b 1M is larger than -e 1K" -- "${MPI2[@]}" $CP -b 1M -e 1K --out $B/x.h5
expect "zero size" 2 "-b '0' is not allowed" -- "${MPI2[@]}" $CP -b 0 --out $B/x.h5
expect "unparsable size" 2 "-e 'lots' is not allowed" -- "${MPI2[@]}" $CP -e lots --out $B/x.h5
expect "unknown operation" 2 "--ops 'all-sum' is not allowed" -- "${MPI2[@]}" $CP --ops all-sum --out $B/x.h5
expect "unknown dtype" 2 "-d 'float8' is not allowed" -- "${MPI2[@]}" $CP -d float8 --out $B/x.h5
expect "unknown reduce op" 2 "-o 'median' is not allowed" -- "${MPI2[@]}" $CP -o median --out $B/x.h5
expect "shard size not dividing the world" 2 "--shard-size 3 is not allowed with world size 4" -- \
  "${MPI4[@]}" $CP --ops hybrid --shard-size 3 --out $B/x.h5
expect "-z 4" 2 "-z 4 is not allowed \(an integer from 0 to 3\)" -- "${MPI2[@]}" $CP -z 4 --out $B/x.h5
expect "-c -1" 2 "-c -1 is not allowed \(an integer from 0 to" -- "${MPI2[@]}" $CP -c -1 --out $B/x.h5
expect "-o mulsum" 2 "-o mulsum is not allowed" -- "${MPI2[@]}" $CP -o mulsum --out $B/x.h5
expect "-r beyond the ranks" 2 "-r 2 is not allowed \(a rank below 2, or all\)" -- "${MPI2[@]}" $CP -r 2 --out $B/x.h5
expect "-K not below -n" 2 "-K 5 is not allowed \(must be below -n 5\)" -- "${MPI2[@]}" $CP -n 5 -K 5 --out $B/x.h5
expect "-J into a missing directory" 2 "-J '$B/nope/x.json': directory '$B/nope' does not exist" -- \
  "${MPI2[@]}" $CP -J $B/nope/x.json --out $B/x.h5
if [ -z "$(ls -A $B)" ]; then ok "bad input writes nothing"; else ls $B >"$tmp/out"; bad "bad input writes nothing"; fi

# --- regression check: verdicts on recorded data, never on this machine's timing ---
# tests/data/regress: 20 real back-to-back 2-rank runs (its README). Identical pairs are
# windows of them: a baseline of 8 runs, then the next 3 runs as the current. Slowdowns and
# damage are injected into copies. Nothing here depends on how fast this machine is today.
RX=$tmp/regress
PYTHONPATH="$ROOT/analysis" $PY - "$ROOT/tests/data/regress" "$RX" <<'PYEOF'
import glob, os, shutil, sys, h5py, numpy as np
src, out = sys.argv[1:]
from shardbench_h5 import names as names_of  # (PYTHONPATH: analysis/)
runs = sorted(glob.glob(os.path.join(src, "run*.h5")))
assert len(runs) == 20, runs
def copy(path, dst, scale=1.0, op=None, edit=None, share=None):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(path, dst)
    with h5py.File(dst, "r+") as f:
        if share is not None:  # collective_perf's record of the CPU its ranks had
            f.attrs["cpu_share_min"] = share
        s = f["samples"][()]
        names = names_of(f["samples"])
        sel = np.ones(len(s), bool) if op is None else s["op"] == names.index(op)
        s["time"][sel] *= scale
        if edit:
            s = edit(s)
        attrs = dict(f["samples"].attrs)
        del f["samples"]
        d = f.create_dataset("samples", data=s)
        for k, v in attrs.items():
            d.attrs[k] = v
for i in range(10):  # identical back-to-back pairs
    for j, r in enumerate(runs[i:i + 8]):
        copy(r, f"{out}/pair{i}/base/{j}.h5")
    for j, r in enumerate(runs[i + 8:i + 11]):
        copy(r, f"{out}/pair{i}/cur/{j}.h5")
# a baseline with a run-to-run spread of +-5 % (copies of one real run), and currents made from it
for j, f in enumerate([0.95, 0.97, 0.98, 0.99, 1.01, 1.02, 1.03, 1.05]):
    copy(runs[0], f"{out}/spread5/base/{j}.h5", f)
for j, f in enumerate([0.995, 1.0, 1.005]):  # none a byte copy of a baseline run: a copy is no other run
    copy(runs[0], f"{out}/spread5/same/{j}.h5", f)
    copy(runs[0], f"{out}/spread5/slow13/{j}.h5", 1.3 * f)
    copy(runs[0], f"{out}/spread5/ar2x/{j}.h5", 2.0 * f, op="all-reduce")
# the same with the ranks' CPU share recorded: a baseline at 96-99 %, a 1.3x slower check whose
# ranks had 48 % (starved by other work on their cores) or 93 % (not)
for j, f in enumerate([0.95, 0.97, 0.98, 0.99, 1.01, 1.02, 1.03, 1.05]):
    copy(runs[0], f"{out}/share/base/{j}.h5", f, share=0.96 + 0.004 * j)
for j, f in enumerate([0.995, 1.0, 1.005]):
    copy(runs[0], f"{out}/share/starved/{j}.h5", 1.3 * f, share=0.48)
    copy(runs[0], f"{out}/share/fed/{j}.h5", 1.3 * f, share=0.93)
# damaged or unusable currents
bad = f"{out}/bad"
def field_gone(s):
    return s[[n for n in s.dtype.names if n != "iteration"]]
copy(runs[0], f"{bad}/op-index.h5", edit=lambda s: (s.__setitem__("op", s["op"] + 7), s)[1])
copy(runs[0], f"{bad}/no-iteration-field.h5", edit=field_gone)
copy(runs[0], f"{bad}/some-nan.h5", edit=lambda s: (s["time"].__setitem__(slice(0, 5), np.nan), s)[1])
copy(runs[0], f"{bad}/all-nan.h5", edit=lambda s: (s["time"].__setitem__(slice(None), np.nan), s)[1])
copy(runs[0], f"{bad}/negative.h5", edit=lambda s: (s["time"].__setitem__(3, -1.0), s)[1])
copy(runs[0], f"{bad}/empty.h5", edit=lambda s: s[:0])
data = open(runs[0], "rb").read()
open(f"{bad}/truncated.h5", "wb").write(data[:len(data) // 2])
open(f"{bad}/text.h5", "w").write("not a result\n")
with h5py.File(f"{bad}/foreign.h5", "w") as f:
    f.attrs["program"] = "fsdp_perf"
for j in range(2):
    copy(runs[j], f"{out}/two-runs/{j}.h5")
PYEOF
# No alarm on identical runs, and no false "no regression" either: this VM's back-to-back runs
# vary so much (2-25x between runs) that 8 of them can only reveal slowdowns of +79 % to
# +1818 % (the `detectable` column over the 10 pairs; at least +79 % at every point of every
# pair), far above the 5 % threshold: no point's bound rules out a slowdown of 5 %, every point
# is inconclusive, exit 3 (exit 0 claimed a power these data do not have). A quiet baseline exits 0: tests/regress_power_tests.sh.
for i in $(seq 0 9); do
  expect "regress: identical back-to-back runs, pair $i (8 baseline runs, 3 current): no alarm, inconclusive, exit 3" 3 \
    'inconclusive: 8 of 8 points may be up to \+[0-9]+% to \+[0-9]+% slower \(threshold 5%\); no regression found \(.*8 baseline runs, 3 current' -- \
    $PY $ROOT/analysis/regress.py $RX/pair$i/base $RX/pair$i/cur --report-dir $tmp/rep-pair
done
# A +-5 % run-to-run spread over 8 runs can only reveal slowdowns of +9.9 % (t test at
# 0.01 / 8 points), and an unchanged current may be as much slower: unchanged runs are
# inconclusive at a 5 % threshold, no regression at 12 %.
expect "regress: unchanged runs, a baseline spread +-5 %, threshold 5 %: inconclusive (+9.9%), exit 3" 3 \
  'inconclusive: 8 of 8 points may be up to \+9\.9% slower \(threshold 5%\)' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/spread5/same --report-dir $tmp/rep0
expect "regress: the same at --threshold 0.12: no regression, exit 0" 0 'no regression in 8 points; each is at most \+9\.9% slower, within the threshold \(smallest detectable \+9\.9%\)' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/spread5/same --threshold 0.12 --report-dir $tmp/rep0b
expect "regress: 1.3x slower, every point flagged, exit 1" 1 '8 regression\(s\) in 8 points' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/spread5/slow13 --report-dir $tmp/rep1
cp "$tmp/out" "$tmp/slow13.out"
check "regress: the p-value states its direction" grep -q 'p(slower)=' "$tmp/slow13.out"
expect "regress: 1.3x slower on ranks starved of CPU (48 % of a core, the baseline's 97 %): not judged, inconclusive, exit 3" 3 \
  'inconclusive: 8 of 8 points read as regressions, not judged: its ranks had 48% of a core .* against the baseline.s 97%' -- \
  $PY $ROOT/analysis/regress.py $RX/share/base $RX/share/starved --report-dir $tmp/rep1s
cp "$tmp/out" "$tmp/starved.out"
check "... it says to run again on a quiet allocation; the report says the same" bash -c \
  "grep -q 'run the check again on a quiet allocation' '$tmp/starved.out' && grep -q 'not judged: its ranks had 48%' '$tmp/rep1s/report.md'"
expect "regress: the same slowdown at 93 % of a core (within 80 % of the baseline's): flagged, exit 1" 1 '8 regression\(s\) in 8 points' -- \
  $PY $ROOT/analysis/regress.py $RX/share/base $RX/share/fed --report-dir $tmp/rep1f
expect "regress: ... its re-check as slow but on ranks starved of CPU (48 %): a starved re-check confirms nothing, exit 3" 3 \
  'inconclusive: 8 of 8 points read as regressions, not judged: the re-check.s: its ranks had 48% of a core' -- \
  $PY $ROOT/analysis/regress.py $RX/share/base $RX/share/fed --confirm $RX/share/starved --report-dir $tmp/rep1g
expect "regress: a 2x slower all-reduce is flagged, exit 1 (the all-gather's 4 inconclusive)" 1 \
  '4 regression\(s\) in 8 points; 4 other point\(s\) inconclusive: may be up to \+9\.9% slower' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/spread5/ar2x --report-dir $tmp/rep2
if grep -q "all-gather.*REGRESSION" "$tmp/out"; then bad "regress: only the slowed operation is flagged"; else ok "regress: only the slowed operation is flagged"; fi
check "regress: report.md and report.png written" test -s $tmp/rep2/report.md -a -s $tmp/rep2/report.png
expect "regress: bootstrap method flags it too" 1 'REGRESSION' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/spread5/ar2x --method bootstrap --report-dir $tmp/rep3
expect "regress: different sizes cannot be compared, exit 2" 2 'operations or sizes differ' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $R/all2.h5 --report-dir $tmp/rep5
expect "regress: different rank counts cannot be compared, exit 2" 2 'rank counts differ' -- \
  $PY $ROOT/analysis/regress.py $RX/spread5/base $R/all4.h5 --report-dir $tmp/rep6
expect "regress: a baseline of 2 runs carries no spread, exit 2" 2 'needs at least 3 runs' -- \
  $PY $ROOT/analysis/regress.py $RX/two-runs $RX/spread5/same --report-dir $tmp/rep7
for f in op-index:'op code [0-9]+ is not one of' no-iteration-field:'no field iteration' some-nan:'not finite positive' \
  all-nan:'not finite positive' negative:'not finite positive' empty:'no measurements' truncated:'not a readable HDF5' \
  text:'not a readable HDF5' foreign:'not a collective_perf result'; do
  name=${f%%:*}
  expect "regress: $name current is unusable input: one line, exit 2" 2 "$name.h5: .*${f#*:}" -- \
    $PY $ROOT/analysis/regress.py $RX/spread5/base $RX/bad/$name.h5 --report-dir $tmp/rep-bad
  if grep -q Traceback "$tmp/out"; then bad "regress: $name: no traceback"; fi
done
expect "regress: an unusable baseline is refused the same way, exit 2" 2 'all-nan.h5: .*not finite positive' -- \
  $PY $ROOT/analysis/regress.py $RX/bad/all-nan.h5 $RX/spread5/same --report-dir $tmp/rep-bad
if [ -e $tmp/rep5 ] || [ -e $tmp/rep6 ] || [ -e $tmp/rep7 ] || [ -e $tmp/rep-bad ]; then bad "regress writes nothing when it cannot compare"; else ok "regress writes nothing when it cannot compare"; fi

summary
