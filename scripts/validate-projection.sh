#!/usr/bin/env bash
# Measures local CPU runs and checks the projection against them (docs/projection.md).
# For each rank count: calibrate compute from a measured DDP run at that rank count (ranks
# share this machine's cores and memory bandwidth, so compute rates depend on ranks per
# node) and the network from collective_perf at that rank count; project the FSDP
# strategies, which were not used for calibration; then DDP, calibrated from the measured
# FSDP no-shard run instead; compare every projection with its measured run.
# Usage: scripts/validate-projection.sh OUT_DIR [MAX_ERROR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
OUT=${1:?usage: validate-projection.sh OUT_DIR [MAX_ERROR]}
MAX=${2:-}
MODEL=${MODEL:-t5-small}
ARGS=(--model "$MODEL" --batch "${BATCH:-2}" --seq-len "${SEQ:-64}" --steps "${STEPS:-4}" --warmup 1)
RANKS=${RANKS:-"2 4"}
mkdir -p "$OUT/measured" "$OUT/calibration"
run() { # ranks dir name program args...
  local np=$1 dir=$2 name=$3
  shift 3
  mpirun -np "$np" --oversubscribe --bind-to none "$@" "${ARGS[@]}" --out "$OUT/$dir/$name-w$np.h5" --overwrite >/dev/null
}
for np in $RANKS; do
  run "$np" calibration ddp build/bin/ddp_perf
  mpirun -np "$np" --oversubscribe --bind-to none build/bin/collective_perf --ops all-reduce,all-gather,reduce-scatter \
    -b 64K -e 16M -f 4 -n 10 -w 2 --out "$OUT/calibration/coll-w$np.h5" --overwrite >/dev/null
  run "$np" measured fsdp-full build/bin/fsdp_perf --sharding full
  run "$np" measured fsdp-none build/bin/fsdp_perf --sharding none
  strategies=fsdp-full,fsdp-none
  if [ "$np" -ge 4 ]; then run "$np" measured fsdp-hybrid2 build/bin/fsdp_perf --sharding hybrid --shard-size 2; fi
  if [ "$np" -ge 4 ]; then strategies=$strategies,fsdp-hybrid2; fi
  /usr/bin/python3 analysis/project.py --cluster runs/clusters/local-cpu.toml --model "$MODEL" --strategies $strategies \
    --gpus "$np" --batch "${BATCH:-2}" --seq-len "${SEQ:-64}" --calibrate-run "$OUT/calibration/ddp-w$np.h5" \
    --calibrate-collectives "$OUT/calibration/coll-w$np.h5" --require-calibration --out "$OUT/projected" --overwrite >/dev/null
  /usr/bin/python3 analysis/project.py --cluster runs/clusters/local-cpu.toml --model "$MODEL" --strategies ddp \
    --gpus "$np" --batch "${BATCH:-2}" --seq-len "${SEQ:-64}" --calibrate-run "$OUT/measured/fsdp-none-w$np.h5" \
    --calibrate-collectives "$OUT/calibration/coll-w$np.h5" --require-calibration --out "$OUT/projected" --overwrite >/dev/null
  cp "$OUT/calibration/ddp-w$np.h5" "$OUT/measured/ddp-w$np.h5"
done
/usr/bin/python3 analysis/validate_projection.py --measured "$OUT/measured" --projected "$OUT/projected" \
  ${MAX:+--max-error "$MAX"}
