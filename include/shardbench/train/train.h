// ddp_perf and fsdp_perf: the training protocol, written once (src/train/train.cpp):
//   parse → layout → plan → (out of memory? record, exit 3) → backend, mesh, strategy →
//   warm-up + timed steps (barrier, step, cross-rank reduction, rank-0 line) → summary →
//   optional --check against a single-rank reference → HDF5 result.
#pragma once
#include "shardbench/strategy/strategy.h"

namespace sb {

// The whole program: MPI up, parse, plan, run, report, exit code.
int run_program(int argc, char** argv, StrategyKind kind);

}  // namespace sb
