#!/usr/bin/env bash
# make test: every GoogleTest binary, then the MPI integration tests.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
failed=0
for t in build/bin/test_*; do
  echo "=== $t"
  if ! "$t" --gtest_brief=1; then failed=$((failed + 1)); echo "FAILED: $t"; fi
done
echo "=== MPI integration tests"
bash tests/mpi_tests.sh || failed=$((failed + 1))
echo "=== collective_perf and regression tests"
bash tests/collective_tests.sh || failed=$((failed + 1))
if [ "$failed" -ne 0 ]; then echo "make test: $failed suite(s) failed"; exit 1; fi
echo "make test: all suites passed"
