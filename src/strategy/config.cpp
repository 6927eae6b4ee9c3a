// A strategy's configuration: the names of its choices, its label, its layout and the
// pipeline's split.
#include "shardbench/strategy/config.h"

#include <string>
#include <vector>

#include "shardbench/core/check.h"

namespace sb {

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::Full: return "full";
    case Sharding::Hybrid: return "hybrid";
    case Sharding::None: return "none";
    case Sharding::GradOp: return "grad-op";
    case Sharding::OptimizerState: return "optimizer-state";
  }
  return "?";
}

const char* prefetch_name(Prefetch p) {
  switch (p) {
    case Prefetch::None: return "none";
    case Prefetch::BackwardPre: return "backward-pre";
    case Prefetch::BackwardPost: return "backward-post";
  }
  return "?";
}

Sharding parse_sharding(const std::string& s) {
  for (Sharding v : {Sharding::Full, Sharding::Hybrid, Sharding::None, Sharding::GradOp, Sharding::OptimizerState})
    if (s == sharding_name(v)) return v;
  throw UsageError("--sharding '" + s + "' is not allowed (allowed: full, hybrid, none, grad-op, optimizer-state)");
}

Sharding sharding_of_zero_stage(int stage) {
  static const Sharding by_stage[] = {Sharding::None, Sharding::OptimizerState, Sharding::GradOp, Sharding::Full};
  if (stage < 0 || stage > 3)
    throw UsageError("--zero-stage " + std::to_string(stage) + " is not allowed (allowed: 0, 1, 2, 3)");
  return by_stage[stage];
}

int zero_stage(Sharding s) {
  switch (s) {
    case Sharding::None: return 0;
    case Sharding::OptimizerState: return 1;
    case Sharding::GradOp: return 2;
    case Sharding::Full:
    case Sharding::Hybrid: return 3;
  }
  return -1;
}

Prefetch parse_prefetch(const std::string& s) {
  for (Prefetch v : {Prefetch::None, Prefetch::BackwardPre, Prefetch::BackwardPost})
    if (s == prefetch_name(v)) return v;
  throw UsageError("--prefetch '" + s + "' is not allowed (allowed: none, backward-pre, backward-post)");
}

const char* grad_accumulation_name(GradAccumulation g) {
  return g == GradAccumulation::Sharded ? "sharded" : "unsharded";
}

GradAccumulation parse_grad_accumulation(const std::string& s) {
  for (GradAccumulation v : {GradAccumulation::Unsharded, GradAccumulation::Sharded})
    if (s == grad_accumulation_name(v)) return v;
  throw UsageError("--grad-accumulation '" + s + "' is not allowed (allowed: unsharded, sharded)");
}

const char* cpu_offload_name(CpuOffload o) {
  switch (o) {
    case CpuOffload::None: return "none";
    case CpuOffload::Params: return "params";
    case CpuOffload::Optimizer: return "optimizer";
  }
  return "?";
}

CpuOffload parse_cpu_offload(const std::string& s) {
  for (CpuOffload v : {CpuOffload::None, CpuOffload::Params, CpuOffload::Optimizer})
    if (s == cpu_offload_name(v)) return v;
  throw UsageError("--cpu-offload '" + s + "' is not allowed (allowed: none, params, optimizer)");
}

std::string StrategyConfig::label() const {
  const std::string tensor = (tp > 1 ? "-tp" + std::to_string(tp) : "") + (pp > 1 ? "-pp" + std::to_string(pp) : "");
  if (kind == StrategyKind::DDP) return "ddp" + tensor;
  std::string l = std::string("fsdp-") + sharding_name(sharding);
  if (sharding == Sharding::Hybrid || (sharding == Sharding::OptimizerState && shard_size > 0))
    l += std::to_string(shard_size);
  // CPU offload last, after the layout: fsdp-full-tp2-offload-params (analysis/strategy_labels.py)
  const std::string offload = cpu_offload == CpuOffload::None ? "" : std::string("-offload-") + cpu_offload_name(cpu_offload);
  return l + tensor + offload;
}

ParallelLayout layout_for(const StrategyConfig& c, int world, int rank) {
  // The shard group: every data-parallel rank (full, grad-op, optimizer-state), --shard-size
  // (hybrid; optimizer-state where given), or one.
  // make() checks --tp and --pp before the shard size, so a quotient of bad sizes is never used.
  const int64_t inner = int64_t(c.tp) * c.pp;
  int shard = 1;
  const bool whole_dp = c.sharding == Sharding::Full || c.sharding == Sharding::GradOp ||
                        (c.sharding == Sharding::OptimizerState && c.shard_size == 0);
  if (c.kind == StrategyKind::FSDP && whole_dp) shard = inner >= 1 ? int(world / inner) : 1;
  if (c.kind == StrategyKind::FSDP && !whole_dp && c.shard_size > 0) shard = c.shard_size;
  return ParallelLayout::make(world, rank, shard, c.tp, c.pp);
}

PipelineSplit pipeline_split(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape) {
  const int L = int(spec.layers);
  if (c.pp == 1) return PipelineSplit{{0, 2 * L + 3}};
  std::vector<double> cost;
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_encoder_block(spec, shape, c.tp));
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_decoder_block(spec, shape, c.tp));
  cost.back() += forward_flops_head(spec, shape, c.tp);
  return split_pipeline(cost, L, c.pp, c.first_decoder_stage);
}

}  // namespace sb
