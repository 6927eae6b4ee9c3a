// The memory plan: one step of the configured strategy on the counting backend, for rank 0
// of the layout's world, and under pipeline parallelism for the first rank of every stage
// (the stages hold different parts of the model); nothing is allocated or computed.
#pragma once
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/strategy/setup.h"
#include "shardbench/train/options.h"

namespace sb {

// Ops of one kind and place summed: how many, their bytes, and the bytes this rank sent in
// them (ops with a mesh axis: collectives, sends, receives).
struct OpSums {
  int64_t count = 0, bytes = 0, sent = 0;
};

// One stage's step summed as its ops are issued (the schedule JSON's "totals"), so a plan
// asked without its ops keeps no schedule: the device's lanes (compute and communication) by
// kind and mesh axis (slot 0: none); the host offload's lanes in a group of their own (the
// uploads, the downloads, the CPU update); the GEMM FLOPs; and the compute lane's distinct
// GEMM shapes (m, n, k, batch: count, FLOPs) and elementwise sizes (bytes: count), a few
// dozen each, so an estimate can cost each shape as the replay does.
struct PlanTotals {
  static constexpr int kKinds = int(OpKind::kCount), kSlots = kAxes + 1;
  OpSums ops[kKinds][kSlots] = {};  // the device's lanes
  OpSums h2d, d2h, update;          // the host offload's lanes: kCopyH2DLane, kCopyD2HLane, kHostLane
  int64_t gemm_flops = 0;
  std::map<std::array<int32_t, 4>, std::pair<int64_t, int64_t>> gemm_shapes;
  std::map<int64_t, int64_t> elementwise_sizes;
  void add(const OpEvent& e, int times = 1);
  // Every sum above but the maps', in one order: f(int64_t&) on each. The one list of the
  // figures, so whatever iterates them (the extension from three plans, plan.cpp) misses none.
  template <typename F>
  void each_sum(F f) {
    for (auto& kind : ops)
      for (OpSums& s : kind) f(s.count), f(s.bytes), f(s.sent);
    for (OpSums* s : {&h2d, &d2h, &update}) f(s->count), f(s->bytes), f(s->sent);
    f(gemm_flops);
  }
};

// One pipeline stage's plan (the whole step without --pp).
struct StagePlan {
  int first_piece = 0, last_piece = 0;  // the pieces it runs, [first, last)
  MemBytes peak{};              // per category, each at its own peak
  MemBytes at_peak{};           // per category at the moment of the total peak
  int64_t peak_total = 0;
  // The host ledger's (alloc_host: CPU offload) the same way, at its own total peak.
  MemBytes host_peak{}, host_at_peak{};
  int64_t host_peak_total = 0;
  std::vector<int> units;       // the units it holds (those its pieces use)
  int64_t params = 0;           // parameters it holds (a tensor-parallel rank's part)
  double counted_flops = 0;     // GEMM FLOPs of one step, as the schedule issues them
  PlanTotals totals;             // of one step
  std::vector<OpEvent> schedule;  // GEMMs, collectives, waits, optimizer of one step, in order (with ops)
};

struct MemoryPlan {
  ParallelLayout layout;        // the world and shard group planned for (rank 0's view)
  PipelineSplit split;          // the stages' pieces planned for (the setup's)
  std::vector<StagePlan> stages;  // one per pipeline stage
  // The stage with the highest peak (every rank's limit is the same):
  MemBytes peak{};
  MemBytes at_peak{};
  int64_t peak_total = 0;
  int worst_stage = 0;
  int64_t limit = 0;            // bytes (--mem-limit-gib)
  // Host memory (CPU offload), of the stage with the highest host peak, against its own
  // limit (--host-mem-limit-gib).
  MemBytes host_peak{};
  MemBytes host_at_peak{};
  int64_t host_peak_total = 0;
  int worst_host_stage = 0;
  int64_t host_limit = 0;       // bytes
  double counted_flops = 0;     // stage 0's (the whole step's without --pp); its schedule: stages[0].schedule
  std::vector<int> line_micro_batches;  // the micro-batch counts it was extended from (plan.cpp); empty: planned directly
  bool device_fits() const { return peak_total <= limit; }
  bool host_fits() const { return host_peak_total <= host_limit; }
  bool fits() const { return device_fits() && host_fits(); }  // out-of-memory (exit 3) otherwise
};

// with_ops false: the stages' schedules are left empty (their totals are kept), and a
// pipeline of many micro-batches (1F1B; GPipe where its peak allows) is planned from three
// plans of fewer (plan.cpp says how).
MemoryPlan plan_memory(const Setup& setup, bool with_ops = true);
// The limits the plan is judged against: --mem-limit-gib and --host-mem-limit-gib, or the
// defaults given (the device's free memory, else the host's share; the host's share).
void set_plan_limits(MemoryPlan& plan, const RunConfig& cfg, int64_t default_limit, int64_t default_host_limit);
// The plan and the step's schedule as JSON (analysis/project.py replays it): the object
// --schedule-json writes and --plan-batch prints, one home for both. Without ops, the
// per-operation rows ("ops", and each pipeline stage's "ops") are left out. The strategy is
// the setup's (resolved), the rest of the run `cfg`'s.
std::string schedule_json(const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan, bool with_ops = true);
void write_schedule_json(const std::string& path, const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan);
// The plan as a table (rank 0 prints it).
std::string format_plan(const RunConfig& cfg, const Setup& setup, const MemoryPlan& plan);

}  // namespace sb
