// The memory plan: one step of the configured strategy on the counting backend, for rank 0
// of the layout's world; nothing is allocated or computed.
#pragma once
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/train/options.h"

namespace sb {

struct MemoryPlan {
  ParallelLayout layout;        // the world and shard group planned for (rank 0's view)
  MemBytes peak{};              // per category, each at its own peak
  MemBytes at_peak{};           // per category at the moment of the total peak
  int64_t peak_total = 0;
  int64_t limit = 0;            // bytes
  double counted_flops = 0;     // GEMM FLOPs of one step, as the schedule issues them
  std::vector<OpEvent> schedule;  // GEMMs, collectives, waits, optimizer of one step, in order
  bool fits() const { return peak_total <= limit; }
};

MemoryPlan plan_memory(const RunConfig& cfg, const ParallelLayout& layout);
// The plan and the step's schedule as JSON (analysis/project.py replays it).
void write_schedule_json(const std::string& path, const RunConfig& cfg, const MemoryPlan& plan);
// The plan as a table (rank 0 prints it).
std::string format_plan(const RunConfig& cfg, const MemoryPlan& plan);

}  // namespace sb
