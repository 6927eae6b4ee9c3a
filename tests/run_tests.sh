#!/usr/bin/env bash
# make test: every GoogleTest binary, then the MPI integration tests.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
failed=0 skipped=() times=()

# suite TITLE CMD...: one suite, titled and timed. A failure counts; exit 77 is a skip (the
# suite says why in one line; never a pass). The times close the run, slowest first, so the
# log says what makes `make test` long.
suite() {
  local title=$1; shift
  echo "=== $title"
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  times+=("$((SECONDS - t0))	$title")
  if [ "$rc" -eq 77 ]; then skipped+=("${title%%:*}")
  elif [ "$rc" -ne 0 ]; then failed=$((failed + 1)); echo "FAILED: $title (exit $rc)"; fi
}
py() { /usr/bin/python3 "$@"; }
self_tested() { py "$1" --self-test && py "$1"; }

# kernel_bench's smoke: t5-tiny shapes, every kind present, its counters positive.
kernel_bench_smoke() {
  build/bin/kernel_bench --benchmark_filter='t5-tiny/' --benchmark_min_time=0.01 --benchmark_format=json \
      2>/dev/null | py -c '
import json, sys
runs = json.load(sys.stdin)["benchmarks"]
kinds = {r["name"].split("/")[0] for r in runs}
assert kinds == {"gemm", "pack", "adam", "optimizer", "attention"}, kinds
assert all(r["FLOP/s"] > 0 for r in runs if "gemm" in r["name"]), "GEMM FLOP/s"
assert all(r["bytes/s"] > 0 for r in runs if "attention" not in r["name"]), "bytes/s"
att = [r for r in runs if r["name"].startswith("attention/")]
paths = {r["name"].split("/")[2] + "/" + r["name"].split("/")[3] for r in att}
assert paths == {"unfused/bf16", "fused/bf16", "unfused/fp32", "fused/fp32"}, paths
assert all(r["ms"] > 0 and r["TFLOPS"] > 0 for r in att), "attention ms, TFLOPS"
print(len(runs), "benchmarks, counters present; kernel_bench: ok")'
}

suite "first contact: make demo / make test on a machine where deps installs the packages (tests/first_contact_test.sh)" \
  bash tests/first_contact_test.sh
suite "the repo stands on its own (citations, paths, issue numbers)" bash tests/check_self_contained.sh
suite "the docs say what the code does: links, and every flag of their commands in the program's --help (tests/check_docs.py)" \
  self_tested tests/check_docs.py
suite "layers: no #include points up the layers (tests/check_layers.py, docs/architecture.md)" \
  self_tested tests/check_layers.py
for t in build/bin/test_*; do suite "$t" "$t" --gtest_brief=1; done
suite "kernel_bench (smoke: t5-tiny shapes, JSON with FLOP/s and bytes/s counters, attention ms and TFLOPS)" kernel_bench_smoke
suite "MPI integration tests" bash tests/mpi_tests.sh
suite "tensor parallelism: --tp with every strategy (tests/tp_tests.sh)" bash tests/tp_tests.sh
suite "pipeline parallelism: --pp with GPipe and 1F1B (tests/pp_tests.sh)" bash tests/pp_tests.sh
suite "multinode: every strategy across emulated hosts, shaped links (tests/multinode_tests.sh)" \
  bash tests/multinode_tests.sh
suite "pair sweeps: which node, which link, and their diagnosis across emulated hosts (tests/pair_sweep_tests.sh)" \
  bash tests/pair_sweep_tests.sh
suite "the GPU window and ledger without a GPU: scripts/gpu-window.sh, gpu-check.sh --stale (tests/gpu_window_test.sh)" \
  bash tests/gpu_window_test.sh
suite "collective_perf and regression tests" bash tests/collective_tests.sh
suite "the regression verdict knows its power: inconclusive, never a pass, on a noisy baseline (tests/regress_power_tests.sh)" \
  bash tests/regress_power_tests.sh
suite "history of interconnect checks and its change points (tests/history_tests.sh)" bash tests/history_tests.sh
suite "--plan-batch: each line's schedule and exit code equal its single --plan run's (tests/test_plan_batch.py)" \
  py tests/test_plan_batch.py
suite "bad input: one line and exit 2 for every flag, sizes at the limits, failed records, --out links (tests/bad_input_tests.sh)" \
  bash tests/bad_input_tests.sh
suite "projection: the study's findings and the one-GPU calibration (tests/test_projection.py)" py tests/test_projection.py
suite "projection across emulated links: the fixed case, measured against projected (tests/emulated-cases.txt)" \
  bash -c 'rm -rf build/validate-emulated-fixed && MATRIX_REPEAT=1 scripts/validate-emulated.sh build/validate-emulated-fixed --cases tests/emulated-cases.txt'
suite "the layout advisor (tests/test_advise.py)" py tests/test_advise.py
suite "analysis: figures, report, projection" bash tests/analysis_tests.sh

echo "=== time per suite, slowest first (total ${SECONDS} s)"
printf '%s\n' "${times[@]}" | sort -t$'\t' -k1,1nr | head -12 | awk -F'\t' '{printf "%6d s  %s\n", $1, substr($2, 1, 90)}'
if [ "$failed" -ne 0 ]; then echo "make test: $failed suite(s) failed"; exit 1; fi
if [ ${#skipped[@]} -gt 0 ]; then
  echo "make test: all suites that ran passed; ${#skipped[@]} skipped (no network namespaces here): ${skipped[*]}"
else
  echo "make test: all suites passed"
fi
