#!/usr/bin/env bash
# Bad input to the programs (fsdp_perf, ddp_perf, collective_perf) and what the project's
# own tools make of a failed run: one line naming the value and what is allowed, exit 2 (3
# where the plan does not fit), no partial result, no rank left behind; a record of a run
# the watchdog ended reads as `status = failed` everywhere; --out through symbolic links;
# the temporaries of killed runs cleaned by the next run. Fast: --plan, t5-tiny, 2 ranks.
#   BIN=/other/build/bin bash tests/bad_input_tests.sh   # the programs of another build
# Ends with "N passed, N failed".
set -uo pipefail
given_bin=${BIN:-}
source "$(dirname "$0")/lib.sh"
BIN=${given_bin:-$BIN}
MPI2=(timeout 120 mpirun -np 2 --oversubscribe --bind-to none)
PLAN=(--model t5-tiny --plan --world-size 2)
TINY=(--model t5-tiny --batch 2 --seq-len 8 --dec-seq-len 8 --steps 1 --warmup 0)
T=$tmp/traces
mkdir -p "$T"
echo "programs: $BIN"

# --- 1. a run the watchdog ends is recorded as failed, and every tool reads it so ---
# One rank, held in the publish step (test hook) past --timeout-s: the watchdog records it.
expect "a run held past --timeout-s: the watchdog ends it and records it" 1 "recorded the run as failed in $T/stuck.h5" -- \
  env SHARDBENCH_INJECT_FAULT=publish-delay=8 timeout 60 $BIN/fsdp_perf "${TINY[@]}" --timeout-s 2 --out $T/stuck.h5
expect "failed record: shardbench_h5.py --status says failed" 0 "stuck.h5: failed$" -- \
  $PY $ROOT/analysis/shardbench_h5.py --status $T/stuck.h5
expect "failed record: summarize lists it as failed" 0 "fsdp-full +t5-tiny +1 +2 +8 .* failed$" -- \
  $PY $ROOT/analysis/summarize.py $T/stuck.h5
expect "failed record: compare names it as not completed (failed)" 1 "not completed runs: .*stuck.h5 \(failed\)" -- \
  $PY $ROOT/analysis/compare.py $T/stuck.h5
expect "failed record: to_perfetto says in one line it has no events" 2 \
  "^to_perfetto: error: .*stuck.h5: a result without events \(status failed\): nothing to draw$" -- \
  $PY $ROOT/analysis/to_perfetto.py $T/stuck.h5 -o $T/stuck.json
mkdir -p $T/failed-only && cp $T/stuck.h5 $T/failed-only/
expect "failed record: report shows it as failed" 0 "report: .*index.html .* 1 runs\)" -- \
  $PY $ROOT/analysis/report.py $T/failed-only --out $T/report --timelines 0
if grep -q "<td>failed</td>" $T/report/index.html 2>/dev/null; then ok "failed record: the report's table says failed"
else bad "failed record: the report's table says failed"; fi

# --- 2. shapes near the flags' limits: refused in one line naming the flags, or planned ---
expect "--heads x --d-kv beyond an int: refused naming both" 2 \
  "error: --heads 2147483647 x --d-kv 2147483647 = .* is not allowed \(the attention width .* at most 2147483647\)$" -- \
  timeout 60 $BIN/fsdp_perf "${PLAN[@]}" --heads 2147483647 --d-kv 2147483647
expect "--heads x --d-kv beyond an int, --pp 2: refused too" 2 "error: --heads 2147483647 x --d-kv 2147483647 = " -- \
  timeout 60 $BIN/fsdp_perf "${PLAN[@]}" --heads 2147483647 --d-kv 2147483647 --pp 2
expect "--layers 2147483647 --pp 2: refused, nothing allocated" 2 \
  "error: --layers 2147483647 is not allowed \(an integer from 1 to 1024" -- \
  timeout 60 $BIN/fsdp_perf "${PLAN[@]}" --layers 2147483647 --pp 2
expect "--d-ff x --d-model beyond 2^62 bytes: refused naming them" 2 \
  "error: --d-ff 2147483647 x --d-model 2147483647 x --layers 2 is not allowed \(feed-forward weights of about" -- \
  timeout 60 $BIN/fsdp_perf "${PLAN[@]}" --d-ff 2147483647 --d-model 2147483647
expect "--batch 2147483647 --seq-len 1: refused, not allocated" 2 \
  "error: --batch 2147483647 x --layers 2 = 4294967294 sequence passes per step is not allowed" -- \
  timeout 60 $BIN/fsdp_perf "${PLAN[@]}" --batch 2147483647 --seq-len 1
expect "--d-model 2147483647 --pp 2 --tp 2: planned (does not fit, exit 3)" 3 "DOES NOT FIT: short by [0-9.]+ TiB" -- \
  timeout 60 $BIN/fsdp_perf --model t5-tiny --plan --world-size 4 --d-model 2147483647 --pp 2 --tp 2
# Every shape flag at its largest value, alone and with --pp 2: exit 2 or 3 in seconds,
# never an assertion, an abort, a bad_alloc or a negative (wrapped) figure.
wrong=""
for f in --d-model --d-ff --heads --d-kv --vocab --layers --seq-len --dec-seq-len --batch --micro-batches; do
  for extra in "" "--pp 2"; do
    timeout 30 $BIN/fsdp_perf "${PLAN[@]}" $f 2147483647 $extra >"$tmp/one" 2>&1
    rc=$?
    if { [ $rc -ne 2 ] && [ $rc -ne 3 ]; } || grep -qE "fatal|assertion|bad_alloc| -[0-9]" "$tmp/one"; then
      wrong+="$f 2147483647 $extra: exit $rc: $(grep -m1 -E 'error|fatal|assert|-[0-9]' "$tmp/one")"$'\n'
    fi
  done
done
if [ -z "$wrong" ]; then ok "every shape flag at 2147483647 (alone, --pp 2): exit 2 or 3, no abort or wrapped figure"
else printf '%s' "$wrong" >"$tmp/out"; bad "every shape flag at 2147483647 (alone, --pp 2): exit 2 or 3, no abort or wrapped figure"; fi

# --- 3. an empty value is refused for every flag that takes one, of every program ---
# The flags are read from each program's --help; a flag given twice takes its last value.
value_flags() { "$@" --help | sed -nE 's/^ +(-[A-Za-z],)?(--[a-z_-]+) (TEXT|INT|FLOAT).*/\2/p'; }
check "--help shows what a numeric flag takes (INT, FLOAT), not TEXT" bash -c \
  "$BIN/fsdp_perf --help | grep -qE '^ +--steps INT' && $BIN/fsdp_perf --help | grep -qE '^ +--mem-limit-gib FLOAT' \
   && ! $BIN/fsdp_perf --help | grep -qE '^ +--(steps|mem-limit-gib) TEXT'"
empty_values() {  # NAME PREFIX-ARGS... -- PROGRAM: every value flag of PROGRAM given ''
  local name=$1 wrong="" f rc
  shift
  local -a pre=()
  while [ "$1" != "--" ]; do pre+=("$1"); shift; done
  shift
  for f in $(value_flags "$@"); do
    timeout 30 "$@" "${pre[@]}" $f '' >"$tmp/one" 2>&1
    rc=$?
    if [ $rc -ne 2 ] || ! grep -qE "error: $f '' is not allowed \(an empty value; give one, or drop $f for its default" "$tmp/one"; then
      wrong+="$f '': exit $rc: $(grep -m1 -vE '^ *$' "$tmp/one")"$'\n'
    fi
  done
  if [ -z "$wrong" ]; then ok "$name"; else printf '%s' "$wrong" >"$tmp/out"; bad "$name"; fi
}
empty_values "fsdp_perf: every flag refuses an empty value (exit 2, one line)" "${PLAN[@]}" -- $BIN/fsdp_perf
empty_values "ddp_perf: every flag refuses an empty value (exit 2, one line)" "${PLAN[@]}" -- $BIN/ddp_perf
empty_values "collective_perf: every flag refuses an empty value (exit 2, one line)" \
  -b 64 -e 64 -n 1 -w 0 --overwrite --out $T/cp-empty.h5 -- $BIN/collective_perf
if ls results/ >/dev/null 2>&1; then ls -R results >"$tmp/out"; bad "--out '' wrote nothing under results/"
else ok "--out '' wrote nothing under results/"; fi
expect "--out= (attached) is refused the same way" 2 "error: --out= is not allowed \(an empty value" -- \
  $BIN/fsdp_perf "${TINY[@]}" --out=
expect "--plan= (a flag) is refused" 2 "error: --plan= is not allowed \(an empty value; the flag alone: --plan\)" -- \
  $BIN/fsdp_perf "${PLAN[@]}" --plan=

# --- 3b. --optimizer: an unknown optimizer, --momentum without sgd, --check --tp with 8-bit:
# one line naming the flag and what is allowed, exit 2, no result file ---
one_error_no_file() {  # NAME PATTERN FILE COMMAND...
  local name=$1 pattern=$2 file=$3
  shift 3
  "$@" >"$tmp/out" 2>&1
  local rc=$? lines
  lines=$(grep -c 'error:' "$tmp/out")
  if [ $rc -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qE -- "$pattern" "$tmp/out" || [ -e "$file" ] ||
     ls "$file".*tmp >/dev/null 2>&1; then
    echo "      exit $rc, $lines error lines, file $( [ -e "$file" ] && echo left || echo none)" >>"$tmp/out"; bad "$name"
  else ok "$name"; fi
}
one_error_no_file "--optimizer adam: one line naming the allowed ones, exit 2, no file" \
  "error: --optimizer 'adam' is not allowed \(allowed: adamw, adamw-8bit, sgd\)$" $T/opt.h5 \
  "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer adam --out $T/opt.h5
one_error_no_file "ddp_perf --optimizer ADAMW (names are lower case): refused" \
  "error: --optimizer 'ADAMW' is not allowed \(allowed: adamw, adamw-8bit, sgd\)$" $T/opt.h5 \
  "${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --optimizer ADAMW --out $T/opt.h5
one_error_no_file "--momentum without --optimizer sgd: refused" \
  "error: --momentum is only allowed with --optimizer sgd$" $T/opt.h5 \
  "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --optimizer adamw --momentum 0.5 --out $T/opt.h5
one_error_no_file "--weight-decay -1: refused with its range" "error: --weight-decay -1 is not allowed" $T/opt.h5 \
  "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --weight-decay -1 --out $T/opt.h5
one_error_no_file "--check --tp 2 --optimizer adamw-8bit: refused, saying why" \
  "error: --check with --tp > 1 is not allowed with --optimizer adamw-8bit" $T/opt.h5 \
  "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --tp 2 --optimizer adamw-8bit --check --out $T/opt.h5

# --- 4. --out naming a dangling symbolic link: written through to its target, as cp does ---
ln -s $T/target.h5 $T/link.h5
expect "--out a dangling link: the run writes its target" 0 "wrote $T/target.h5" -- \
  "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --out $T/link.h5
if [ -L $T/link.h5 ] && [ -f $T/target.h5 ] && [ ! -L $T/target.h5 ] && ! ls $T/link-2.h5 $T/target-2.h5 >/dev/null 2>&1; then
  ok "the link stays a link to the result, nothing kept aside"
else ls -la $T >"$tmp/out"; bad "the link stays a link to the result, nothing kept aside"; fi
expect "the result read through the link is ok" 0 "link.h5: ok$" -- $PY $ROOT/analysis/shardbench_h5.py --status $T/link.h5
expect "an existing link target is not replaced without --overwrite" 2 \
  "error: --out '$T/link.h5' \(a symbolic link to '$T/target.h5'\) exists \(pass --overwrite" -- \
  $BIN/fsdp_perf "${TINY[@]}" --out $T/link.h5
ln -s $T/cp-target.h5 $T/cp-link.h5
expect "collective_perf --out a dangling link writes its target" 0 "" -- \
  $BIN/collective_perf -b 64 -e 64 -n 1 -w 0 --out $T/cp-link.h5
if [ -L $T/cp-link.h5 ] && [ -f $T/cp-target.h5 ]; then ok "collective_perf: the link stays, the target holds the result"
else ls -la $T >"$tmp/out"; bad "collective_perf: the link stays, the target holds the result"; fi
expect "--help says how --out treats a link" 0 "a symbolic link, even a dangling one, is written through to its target" -- \
  $BIN/fsdp_perf --help

# --- 5. smaller ---
expect "--pp 8 on 4 blocks: the pipeline's own error, not --batch's" 2 \
  "error: --pp 8 is not allowed with 4 blocks \(2 encoder \+ 2 decoder; at most one stage per block\)$" -- \
  $BIN/fsdp_perf --model t5-tiny --pp 8 --plan --world-size 8
expect "the shard size is named as the flag, --shard-size" 2 "error: --shard-size 3 is not allowed with world size 4" -- \
  $BIN/fsdp_perf --model t5-tiny --sharding hybrid --shard-size 3 --plan --world-size 4
expect "collective_perf names --shard-size too" 2 "error: --shard-size 3 is not allowed with world size 2" -- \
  "${MPI2[@]}" $BIN/collective_perf --ops hybrid --shard-size 3 --out $T/cp-shard.h5
expect "unknown arguments in the order given" 2 "error: The following arguments were not expected: --foo --bar \(see --help\)$" -- \
  $BIN/fsdp_perf --foo --bar
expect "collective_perf: unknown arguments in the order given" 2 "not expected: --foo --bar " -- \
  $BIN/collective_perf --foo --bar
# A SIGKILL of every rank while the result is written leaves its temporary; the next run to
# the same --out removes it (its writer's lock is gone) and says so.
SHARDBENCH_INJECT_FAULT=publish-delay=60 "${MPI2[@]}" -x SHARDBENCH_INJECT_FAULT $BIN/fsdp_perf "${TINY[@]}" \
  --out $T/killed.h5 >"$tmp/out" 2>&1 &
launcher=$!
for i in $(seq 150); do ls $T/killed.h5.*.tmp >/dev/null 2>&1 && break; sleep 0.2; done
for p in $(pgrep -f "^$BIN/fsdp_perf .*$T/killed.h5"); do kill -KILL $p; done  # the ranks, not mpirun
wait $launcher 2>/dev/null
if ls $T/killed.h5.*.tmp >/dev/null 2>&1 && [ ! -e $T/killed.h5 ]; then
  ok "SIGKILL of every rank while writing: the temporary is left"
  expect "the next run to that --out removes the killed run's temporary" 0 \
    "removed '$T/killed.h5\.[^']*\.tmp', the temporary of an earlier run to this --out that was killed" -- \
    "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --out $T/killed.h5
  if ls $T/killed.h5.*.tmp >/dev/null 2>&1; then ls -la $T >"$tmp/out"; bad "no temporary is left after the next run"
  else ok "no temporary is left after the next run"; fi
else
  ls -la $T >>"$tmp/out"; bad "SIGKILL of every rank while writing: the temporary is left"
fi
# Another host's temporary (its lock may be node-local) goes only once untouched for 10 minutes.
: >$T/other.h5.elsewhere.4242.tmp
: >$T/other.h5.gone.4243.failed.tmp
touch -d '1 hour ago' $T/other.h5.gone.4243.failed.tmp
expect "a run to an --out with other hosts' temporaries" 0 "removed '$T/other.h5.gone.4243.failed.tmp'" -- \
  $BIN/fsdp_perf "${TINY[@]}" --out $T/other.h5
if [ -e $T/other.h5.elsewhere.4242.tmp ] && [ ! -e $T/other.h5.gone.4243.failed.tmp ]; then
  ok "another host's recent temporary is kept, its hour-old one removed"
else ls -la $T >"$tmp/out"; bad "another host's recent temporary is kept, its hour-old one removed"; fi
# A live writer's temporary is never taken for stale: a run to the same --out leaves it.
# The writer is stopped (SIGSTOP) once its temporary exists, so it is still writing however
# slowly the machine runs the plan beside it, and continued afterwards; its steps (seconds
# even on an idle machine, longer on a busy one) and a short delay before publishing leave
# the poll below ample time to see the temporary first.
SHARDBENCH_INJECT_FAULT=publish-delay=3 $BIN/fsdp_perf "${TINY[@]}" --steps 3000 --out $T/live.h5 >"$tmp/live" 2>&1 &
writer=$!
for i in $(seq 300); do ls $T/live.h5.*.tmp >/dev/null 2>&1 && break; sleep 0.1; done
kill -STOP $writer
expect "a plan recorded to the same --out meanwhile (out-of-memory)" 3 "wrote $T/live.h5" -- \
  $BIN/fsdp_perf --model t5-tiny --plan --mem-limit-gib 0.000001 --out $T/live.h5
if ls $T/live.h5.*.tmp >/dev/null 2>&1; then ok "a live writer's temporary is left alone"
else ls -la $T >"$tmp/out"; bad "a live writer's temporary is left alone"; fi
kill -CONT $writer
wait $writer
rc=$?
if [ $rc -eq 6 ] && [ -f $T/live-2.h5 ]; then ok "the live writer finishes, its result kept aside (exit 6)"
else { echo "exit $rc"; cat "$tmp/live"; } >"$tmp/out"; bad "the live writer finishes, its result kept aside (exit 6)"; fi

# --- 6. the host memory limit (CPU offload): out of range is one line and exit 2; the plan
# prints the host side as a block of its own with its limit ---
for v in 0 -1 inf nan 1e10 2097152; do
  name="--host-mem-limit-gib $v: one line, exit 2"
  $BIN/fsdp_perf "${PLAN[@]}" --host-mem-limit-gib $v >"$tmp/out" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/out")" -eq 1 ] &&
    grep -qE "^[^ ]*fsdp_perf: error: --host-mem-limit-gib $v is not allowed \(a finite number > 0 and <= 1048576\)$" "$tmp/out"; then
    ok "$name"
  else echo "      exit $rc" >>"$tmp/out"; bad "$name"; fi
done
expect "--host-mem-limit-gib 3: the plan's host block names the limit" 0 "^  host limit +3.00 GiB  -> fits$" -- \
  $BIN/fsdp_perf "${PLAN[@]}" --cpu-offload optimizer --host-mem-limit-gib 3
expect "--host-mem-limit-gib with --out: recorded in /plan" 3 "wrote $T/host-limit.h5" -- \
  $BIN/fsdp_perf "${PLAN[@]}" --mem-limit-gib 0.000001 --cpu-offload optimizer --host-mem-limit-gib 3 --out $T/host-limit.h5
expect "the record's host limit is 3 GiB" 0 "^3221225472$" -- \
  $PY -c "import h5py; print(h5py.File('$T/host-limit.h5')['plan'].attrs['host_limit'])"

# --- 7a. a flag the rest of the command line leaves nothing to act on: refused in one line
# naming it and what it needs, exit 2 on every rank, no result file ---
one_error_no_file "ddp_perf --host-mem-limit-gib: DDP has no offload" \
  "error: --host-mem-limit-gib is only allowed with CPU offload \(fsdp_perf --cpu-offload; ddp_perf has none\)$" \
  $T/dep.h5 "${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --host-mem-limit-gib 10 --out $T/dep.h5
one_error_no_file "fsdp_perf --host-mem-limit-gib without --cpu-offload" \
  "error: --host-mem-limit-gib is only allowed with --cpu-offload params or optimizer$" \
  $T/dep.h5 "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --host-mem-limit-gib 10 --out $T/dep.h5
one_error_no_file "--pp-schedule without --pp > 1" "error: --pp-schedule is only allowed with --pp > 1$" \
  $T/dep.h5 "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --pp-schedule gpipe --out $T/dep.h5
one_error_no_file "--check-tolerance without --check" "error: --check-tolerance is only allowed with --check$" \
  $T/dep.h5 "${MPI2[@]}" $BIN/ddp_perf "${TINY[@]}" --check-tolerance 2 --out $T/dep.h5
one_error_no_file "--loss-scale-growth-interval with a static loss scale" \
  "error: --loss-scale-growth-interval is only allowed with --loss-scale dynamic" \
  $T/dep.h5 "${MPI2[@]}" $BIN/fsdp_perf "${TINY[@]}" --dtype bf16 --loss-scale-growth-interval 10 --out $T/dep.h5
expect "--overwrite with nothing to overwrite (no --out, no --schedule-json)" 2 \
  "error: --overwrite is only allowed with --out or --schedule-json" -- $BIN/fsdp_perf "${PLAN[@]}" --overwrite

# --- 7b. --plan-batch: an input that cannot be read is one line and exit 2; every output
# line is JSON, a line that is not UTF-8 refused on its own line with its number ---
one_error_no_file "--plan-batch a folder: one line, exit 2" "error: --plan-batch '$T' cannot be read: Is a directory$" \
  $T/none $BIN/fsdp_perf --plan-batch $T
one_error_no_file "--plan-batch a missing file: one line, exit 2" \
  "error: --plan-batch '$T/missing.txt' cannot be read: No such file or directory$" $T/none $BIN/fsdp_perf --plan-batch $T/missing.txt
one_error_no_file "--plan-batch - with a folder on stdin: one line, exit 2" \
  "error: --plan-batch - \(stdin\) cannot be read: Is a directory$" $T/none bash -c "$BIN/fsdp_perf --plan-batch - <$T"
printf -- '--model t5-tiny --world-size 2\n--model t5-\xff --world-size 2\n--world-size 2 --dtype bf\xc3\n# \xfe\n' >$T/bytes.txt
$BIN/fsdp_perf --plan-batch $T/bytes.txt --plan-batch-ops none >$T/bytes.out 2>"$tmp/out"
check "--plan-batch lines with bytes that are not UTF-8: every output line is JSON, each such line refused" $PY -c "
import json
rows = [json.loads(l.decode('utf-8')) for l in open('$T/bytes.out', 'rb')]
print(rows)
assert [(r['line'], r['exit']) for r in rows] == [(1, 0), (2, 2), (3, 2)]
assert rows[1]['error'] == 'line 2 is not valid UTF-8 (byte 0xff at column 12): a --plan-batch line is UTF-8 text'
assert rows[2]['error'].startswith('line 3 is not valid UTF-8 (byte 0xc3 ')"

# --- 7c. --schedule-json: published whole under its name (a temporary beside it first), an
# existing file replaced only with --overwrite, two writers never both told it worked ---
echo keep >$T/sched.json
one_error_no_file "--schedule-json an existing file without --overwrite: refused, exit 2" \
  "error: --schedule-json '$T/sched.json' exists \(pass --overwrite to replace it, or choose another name\)$" \
  $T/none $BIN/fsdp_perf "${PLAN[@]}" --schedule-json $T/sched.json
check "... and the file is left as it was" grep -qx keep $T/sched.json
expect "--schedule-json --overwrite replaces it" 0 "" -- $BIN/fsdp_perf "${PLAN[@]}" --schedule-json $T/sched.json --overwrite
check "... with the plan's JSON, no temporary left" bash -c "$PY -c \"import json; json.load(open('$T/sched.json'))\" &&
  ! ls $T/sched.json.*tmp 2>/dev/null"
for w in 1 2; do $BIN/fsdp_perf "${PLAN[@]}" --schedule-json $T/race.json >"$tmp/race$w" 2>&1 & done
rc1=0 rc2=0
wait %1 || rc1=$?
wait %2 || rc2=$?
cat "$tmp/race1" "$tmp/race2" >"$tmp/out"
if [ $((rc1 == 0)) -ne $((rc2 == 0)) ] && $PY -c "import json; json.load(open('$T/race.json'))" &&
   grep -qE "error: --schedule-json '$T/race.json' (exists|was written by another run while this one ran)" "$tmp/out" &&
   ! ls $T/race.json.*tmp >/dev/null 2>&1; then
  ok "two --schedule-json writers to one name: one writes it, the other is told (exit $rc1, $rc2)"
else echo "exit $rc1, $rc2" >>"$tmp/out"; bad "two --schedule-json writers to one name: one writes it, the other is told"; fi

# --- 7. every program's --help ends pointing to the flag reference ---
for p in fsdp_perf ddp_perf collective_perf; do
  if $BIN/$p --help 2>&1 | tail -n 1 | grep -q "docs/usage.md"; then ok "$p --help ends with docs/usage.md"
  else $BIN/$p --help 2>&1 | tail -n 3 >"$tmp/out"; bad "$p --help ends with docs/usage.md"; fi
done

summary
