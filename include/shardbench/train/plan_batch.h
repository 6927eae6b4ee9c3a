// --plan-batch FILE: the memory plan of many configurations in one process, one JSON line
// each on stdout (src/train/plan_batch.cpp; docs/usage.md, docs/projection.md).
#pragma once
#include "shardbench/train/options.h"

namespace sb {

// Every configuration of cfg.plan_batch (a line of flags each, parsed by parse_options as a
// command line with --plan): {"line", "exit": 0 or 3, "schedule"} or {"line", "exit": 2,
// "error"}, in input order. Collective (the default memory limits); rank 0 alone plans and
// prints. Throws UsageError when FILE cannot be read.
int run_plan_batch(const RunConfig& cfg, StrategyKind kind, int rank);

}  // namespace sb
