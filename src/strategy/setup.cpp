// The setup a strategy runs on: its layout and pipeline split, made and checked once.
#include "shardbench/strategy/setup.h"

#include <algorithm>
#include <vector>

#include "shardbench/core/check.h"

namespace sb {
namespace {

// The pieces each pipeline stage runs: split_pipeline over the blocks' forward FLOPs (the
// head's counted with the last decoder block). Throws UsageError for more stages than blocks
// or a bad --pp-split.
PipelineSplit pipeline_split(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape) {
  const int L = int(spec.layers);
  if (c.pp == 1) return PipelineSplit{{0, 2 * L + 3}};
  std::vector<double> cost;
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_encoder_block(spec, shape, c.tp));
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_decoder_block(spec, shape, c.tp));
  cost.back() += forward_flops_head(spec, shape, c.tp);
  return split_pipeline(cost, L, c.pp, c.first_decoder_stage);
}

// The layout on `world` ranks, seen from rank 0: --pp pipeline stages of consecutive groups
// of ranks, in each tensor-parallel groups of --tp consecutive ranks, and over the world /
// (pp × tp) data-parallel ranks shard groups of all of them (full, grad-op,
// optimizer-state), of one rank (DDP, none) or of --shard-size (hybrid, and optimizer-state
// where given). The sizes are checked by ParallelLayout::make (UsageError naming the flag).
ParallelLayout parallel_layout(const StrategyConfig& c, int world) {
  // make() checks --tp and --pp before the shard size, so a quotient of bad sizes is never used.
  const int64_t inner = int64_t(c.tp) * c.pp;
  int shard = 1;
  const bool whole_dp = c.sharding == Sharding::Full || c.sharding == Sharding::GradOp ||
                        (c.sharding == Sharding::OptimizerState && c.shard_size == 0);
  if (c.kind == StrategyKind::FSDP && whole_dp) shard = inner >= 1 ? int(world / inner) : 1;
  if (c.kind == StrategyKind::FSDP && !whole_dp && c.shard_size > 0) shard = c.shard_size;
  if (c.kind == StrategyKind::FSDP && c.sharding == Sharding::Hybrid && c.shard_size <= 0)
    throw UsageError("--sharding hybrid needs --shard-size G where there are no nodes to take it from (a plan of "
                     "--world-size ranks); a run takes one node's data-parallel ranks");
  return ParallelLayout::make(world, 0, shard, c.tp, c.pp);
}

}  // namespace

int default_micro_batches(int pp, int64_t batch) {
  int64_t m = std::min<int64_t>(pp, batch);
  while (batch % m != 0) --m;
  return int(m);
}

Setup Setup::make(const StrategyConfig& strategy, const ModelSpec& model, const StepShape& shape, int world,
                  const NodeMap* nodes) {
  Setup s{strategy, model, shape, {}, {}};
  StrategyConfig& c = s.strategy;  // resolved here; checked and derived from below
  if (c.micro_batches == 0) c.micro_batches = default_micro_batches(c.pp, shape.batch);
  if (c.kind == StrategyKind::FSDP && c.sharding == Sharding::Hybrid && c.shard_size == 0 && nodes)
    c.shard_size = node_shard_size(c, *nodes);
  s.split = pipeline_split(c, model, shape);
  check_tensor_parallel(model, c.tp);
  s.layout = parallel_layout(c, world);
  return s;
}

Setup Setup::at_rank(int rank) const {
  Setup s = *this;
  s.layout = layout.at_rank(rank);
  return s;
}

}  // namespace sb
