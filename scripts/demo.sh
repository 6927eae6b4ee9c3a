#!/usr/bin/env bash
# make demo: a small FSDP-vs-DDP study on local MPI ranks — DDP and FSDP (full, hybrid 2,
# none) on the same model and data — then a comparison table and a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
NP=${NP:-4}
MODEL=${MODEL:-t5-small}
ARGS=(--model "$MODEL" --batch "${BATCH:-2}" --seq-len "${SEQ:-64}" --steps "${STEPS:-4}" --warmup 1)
OUT=${OUT:-results/demo}
mkdir -p "$OUT"
run() {
  local name=$1
  shift
  echo "=== $name: mpirun -np $NP $*"
  mpirun -np "$NP" --oversubscribe --bind-to none "$@" "${ARGS[@]}" --out "$OUT/$name.h5" --overwrite \
    | tee "$OUT/$name.log"
}
run ddp build/bin/ddp_perf
run fsdp-full build/bin/fsdp_perf --sharding full
run fsdp-hybrid2 build/bin/fsdp_perf --sharding hybrid --shard-size 2
run fsdp-none build/bin/fsdp_perf --sharding none
echo
/usr/bin/python3 analysis/summarize.py "$OUT"/*.h5
echo
/usr/bin/python3 analysis/compare.py "$OUT"/ddp.h5 "$OUT"/fsdp-*.h5 --plot "$OUT/comparison.png"
echo
/usr/bin/python3 analysis/report.py "$OUT"
