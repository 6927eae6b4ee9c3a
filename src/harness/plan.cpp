// The memory plan: one step of the configured strategy on the counting backend, for rank 0
// of any world size. The allocations are the code's own, so the plan is exact for
// everything the backend accounts; the ZeRO formula is printed beside it as a cross-check.
#include <cstdio>
#include <sstream>

#include "shardbench/check.h"
#include "shardbench/harness.h"
#include "shardbench/t5.h"

namespace sb {
namespace {

// Remembers the per-category bytes at the moment the total was highest.
class PeakRecorder : public Recorder {
 public:
  void on_op(const OpEvent&) override {}
  void on_memory(double, const MemBytes& cur) override {
    int64_t total = 0;
    for (int64_t v : cur) total += v;
    if (total > peak_) peak_ = total, at_peak = cur;
  }
  MemBytes at_peak{};

 private:
  int64_t peak_ = -1;
};

}  // namespace

MemoryPlan plan_memory(const RunConfig& cfg, int world) {
  MemoryPlan plan;
  plan.world = world;
  plan.shard = shard_group_size(cfg.strategy, world);
  auto backend = make_counting_backend();
  PeakRecorder rec;
  backend->set_recorder(&rec);
  Mesh mesh = Mesh::planned(ParallelLayout::make(world, 0, plan.shard));
  {
    auto strategy = make_strategy(cfg.strategy, cfg.model, *backend, mesh, cfg.shape);
    const double before = counted_gemm_flops(*backend);
    strategy->step(1, make_tokens(cfg.strategy.seed, 1, 0, cfg.shape, cfg.model.vocab));
    plan.counted_flops = counted_gemm_flops(*backend) - before;
  }
  SB_ASSERT(backend->mem_total_current() == 0, "the plan's schedule leaked memory");
  plan.peak = backend->mem_peak();
  plan.peak_total = backend->mem_peak_total();
  plan.at_peak = rec.at_peak;
  return plan;
}

std::string format_plan(const RunConfig& cfg, const MemoryPlan& plan) {
  const double psi = double(param_count(cfg.model));
  const int n = plan.shard;  // ZeRO's data-parallel degree for the sharded states
  // fp32 model states: 4 bytes of parameters, 4 of gradients, 8 of Adam moments per parameter.
  const double zero[kMemCategories] = {4 * psi / n, 4 * psi / n, 8 * psi / n, -1, -1, -1};
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "memory plan, per rank: %s, %s, world %d, shard group %d, fp32\n",
                cfg.model.name.c_str(), cfg.strategy.label().c_str(), plan.world, plan.shard);
  o << line;
  std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", "category", "peak", "at total peak",
                "ZeRO formula");
  o << line;
  for (int c = 0; c < kMemCategories; ++c) {
    std::snprintf(line, sizeof line, "  %-16s %14s %15s %16s\n", mem_category_name(MemCategory(c)),
                  human_bytes(double(plan.peak[c])).c_str(), human_bytes(double(plan.at_peak[c])).c_str(),
                  zero[c] >= 0 ? human_bytes(zero[c]).c_str() : "-");
    o << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %14s %15s\n", "total peak", human_bytes(double(plan.peak_total)).c_str(),
                "");
  o << line;
  std::snprintf(line, sizeof line, "  %-16s %14s  -> %s\n", "limit", human_bytes(double(plan.limit)).c_str(),
                plan.fits() ? "fits"
                            : ("DOES NOT FIT: short by " + human_bytes(double(plan.peak_total - plan.limit)))
                                  .c_str());
  o << line;
  const double model = model_flops_per_step(cfg.model, cfg.shape);
  const double hw = hardware_flops_per_step(cfg.model, cfg.shape, cfg.strategy.checkpointing);
  std::snprintf(line, sizeof line,
                "FLOPs per rank per step: model %.4g (3 x forward), hardware %.4g, issued by the schedule %.4g\n",
                model, hw, plan.counted_flops);
  o << line;
  return o.str();
}

}  // namespace sb
