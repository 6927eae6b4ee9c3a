#!/usr/bin/env bash
# Measures local CPU runs and checks the projection against them (docs/projection.md):
# calibrate from a 1-rank run and from collective_perf on the same rank count, project,
# compare. Usage: scripts/validate-projection.sh OUT_DIR [MAX_ERROR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
OUT=${1:?usage: validate-projection.sh OUT_DIR [MAX_ERROR]}
MAX=${2:-}
MODEL=${MODEL:-t5-small}
ARGS=(--model "$MODEL" --batch "${BATCH:-2}" --seq-len "${SEQ:-64}" --steps "${STEPS:-4}" --warmup 1)
RANKS=${RANKS:-"2 4"}
mkdir -p "$OUT/measured" "$OUT/calibration"
run() { # ranks name program args...
  local np=$1 name=$2
  shift 2
  mpirun -np "$np" --oversubscribe --bind-to none "$@" "${ARGS[@]}" --out "$OUT/measured/$name-w$np.h5" --overwrite >/dev/null
}
mpirun -np 1 build/bin/fsdp_perf "${ARGS[@]}" --out "$OUT/calibration/run-w1.h5" --overwrite >/dev/null
for np in $RANKS; do
  mpirun -np "$np" --oversubscribe --bind-to none build/bin/collective_perf --ops all-reduce,all-gather,reduce-scatter \
    -b 64K -e 16M -f 4 -n 10 -w 2 --out "$OUT/calibration/coll-w$np.h5" --overwrite >/dev/null
  run "$np" ddp build/bin/ddp_perf
  run "$np" full build/bin/fsdp_perf --sharding full
  run "$np" none build/bin/fsdp_perf --sharding none
  strategies=ddp,fsdp-full,fsdp-none
  if [ "$np" -ge 4 ]; then run "$np" hybrid build/bin/fsdp_perf --sharding hybrid --shard-size 2; fi
  /usr/bin/python3 analysis/project.py --cluster runs/clusters/local-cpu.toml --model "$MODEL" --strategies $strategies \
    --gpus "$np" --batch "${BATCH:-2}" --seq "${SEQ:-64}" --calibrate-run "$OUT/calibration/run-w1.h5" \
    --calibrate-collectives "$OUT/calibration/coll-w$np.h5" --require-calibration --out "$OUT/projected" >/dev/null
done
/usr/bin/python3 analysis/validate_projection.py --measured "$OUT/measured" --projected "$OUT/projected" \
  ${MAX:+--max-error "$MAX"}
