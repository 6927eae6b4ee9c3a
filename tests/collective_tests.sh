#!/usr/bin/env bash
# collective_perf on 2 and 4 ranks: the bus-bandwidth arithmetic and the HDF5 contents
# (recomputed in Python from the raw samples), the data check (including a corrupted
# result being caught), the bandwidth floor, bad input, and analysis/regress.py flagging an
# injected slowdown while passing an unchanged rerun. Ends with "N passed, N failed".
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
expect "unknown operation" 2 "unknown operation 'all-sum'" -- "${MPI2[@]}" $CP --ops all-sum --out $B/x.h5
expect "unknown dtype" 2 "-d 'float8' is not allowed" -- "${MPI2[@]}" $CP -d float8 --out $B/x.h5
expect "unknown reduce op" 2 "-o 'median' is not allowed" -- "${MPI2[@]}" $CP -o median --out $B/x.h5
expect "shard size not dividing the world" 2 "shard size 3 is not allowed with world size 4" -- \
  "${MPI4[@]}" $CP --ops hybrid --shard-size 3 --out $B/x.h5
expect "hybrid without a shard size" 2 "needs --shard-size" -- "${MPI2[@]}" $CP --ops hybrid --out $B/x.h5
expect "-z 4" 2 "-z 4 is not allowed \(0, 1, 2 or 3\)" -- "${MPI2[@]}" $CP -z 4 --out $B/x.h5
expect "-c -1" 2 "-c -1 is not allowed \(a count of checked iterations" -- "${MPI2[@]}" $CP -c -1 --out $B/x.h5
expect "-o mulsum" 2 "-o mulsum is not allowed" -- "${MPI2[@]}" $CP -o mulsum --out $B/x.h5
expect "-r beyond the ranks" 2 "-r 2 is not allowed \(a rank below 2, or all\)" -- "${MPI2[@]}" $CP -r 2 --out $B/x.h5
expect "-K not below -n" 2 "-K 5 is not allowed \(must be below -n 5\)" -- "${MPI2[@]}" $CP -n 5 -K 5 --out $B/x.h5
expect "-J into a missing directory" 2 "-J '$B/nope/x.json': directory '$B/nope' does not exist" -- \
  "${MPI2[@]}" $CP -J $B/nope/x.json --out $B/x.h5
if [ -z "$(ls -A $B)" ]; then ok "bad input writes nothing"; else ls $B >"$tmp/out"; bad "bad input writes nothing"; fi

# --- regression check ---
# "Unchanged" must mean the same system: two consecutive runs on this shared VM have
# differed by up to 2.3x (a whole run slowed down), so the unchanged pair is two random
# halves of the iterations of one run, interleaved in time (not even/odd: MPI alternates
# between iterations by up to 10 %). The slowdown is injected into a copy.
RG=(-b 256K -e 1M -f 4 -n 60 -w 5 -z 1)
"${MPI2[@]}" $CP --ops all-reduce,all-gather "${RG[@]}" --out $R/run.h5 >"$tmp/out" 2>&1 || bad "regression run"
$PY - "$R/run.h5" "$R/base.h5" "$R/rerun.h5" "$R/slow.h5" <<'PYEOF'
import shutil, sys, h5py, numpy as np
src, base, rerun, slow = sys.argv[1:]
def half(dst, parity, scale_op=None):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        s = f["samples"][()]
        order = np.random.default_rng(7).permutation(s["iteration"].max() + 1)  # same split for every point
        side = order[s["iteration"]] % 2
        keep = s[side == parity]
        keep["iteration"] = order[keep["iteration"]] // 2
        if scale_op is not None:
            names = [n.decode() if isinstance(n, bytes) else n for n in f["samples"].attrs["op_names"]]
            keep["time"][keep["op"] == names.index(scale_op)] *= 2.0
        attrs = dict(f["samples"].attrs)
        del f["samples"]
        d = f.create_dataset("samples", data=keep)
        for k, v in attrs.items():
            d.attrs[k] = v
        f.attrs["iters"] = len(np.unique(keep["iteration"]))
half(base, 0)
half(rerun, 1)
half(slow, 1, "all-reduce")
PYEOF
expect "regress: unchanged (interleaved halves of one run) passes" 0 'no regression in 8 points' -- \
  $PY $ROOT/analysis/regress.py $R/base.h5 $R/rerun.h5 --threshold 0.10 --alpha 0.001 --report-dir $tmp/rep1
expect "regress: a 2x slower all-reduce is flagged, exit 1" 1 '4 regression\(s\) in 8 points' -- \
  $PY $ROOT/analysis/regress.py $R/base.h5 $R/slow.h5 --threshold 0.10 --alpha 0.001 --report-dir $tmp/rep2
if grep -q "all-gather.*REGRESSION" "$tmp/out"; then bad "regress: only the slowed operation is flagged"; else ok "regress: only the slowed operation is flagged"; fi
check "regress: report.md and report.png written" test -s $tmp/rep2/report.md -a -s $tmp/rep2/report.png
expect "regress: bootstrap method flags it too" 1 'REGRESSION' -- \
  $PY $ROOT/analysis/regress.py $R/base.h5 $R/slow.h5 --method bootstrap --threshold 0.10 --alpha 0.01 --report-dir $tmp/rep3
mkdir -p $tmp/dirb && cp $R/base.h5 $tmp/dirb/
expect "regress: a baseline directory works" 0 'no regression' -- \
  $PY $ROOT/analysis/regress.py $tmp/dirb $R/rerun.h5 --threshold 0.10 --alpha 0.001 --report-dir $tmp/rep4
expect "regress: different sizes cannot be compared, exit 2" 2 'operations or sizes differ' -- \
  $PY $ROOT/analysis/regress.py $R/base.h5 $R/all2.h5 --report-dir $tmp/rep5
expect "regress: different rank counts cannot be compared, exit 2" 2 'rank counts differ' -- \
  $PY $ROOT/analysis/regress.py $R/base.h5 $R/all4.h5 --report-dir $tmp/rep6
if [ -e $tmp/rep5 ] || [ -e $tmp/rep6 ]; then bad "regress writes nothing when it cannot compare"; else ok "regress writes nothing when it cannot compare"; fi

summary
