// A strategy's configuration: the names of its choices, its label, hybrid's node-sized shard
// group and the placement warning.
#include "shardbench/strategy/config.h"

#include <algorithm>
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

Sharding sharding_of_zero_level(int level) {
  static const Sharding by_level[] = {Sharding::None, Sharding::OptimizerState, Sharding::GradOp, Sharding::Full};
  if (level < 0 || level > 3)
    throw UsageError("--zero-stage " + std::to_string(level) + " is not allowed (allowed: 0, 1, 2, 3)");
  return by_level[level];
}

int zero_level(Sharding s) {
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

bool cpu_offload_allows(CpuOffload o, Sharding s) {
  switch (o) {
    case CpuOffload::None: return true;
    case CpuOffload::Params: return s == Sharding::Full || s == Sharding::Hybrid || s == Sharding::GradOp;
    case CpuOffload::Optimizer: return s != Sharding::None;
  }
  return false;
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

int node_shard_size(const StrategyConfig& c, const NodeMap& nodes) {
  const int world = int(nodes.node_of.size()), per_node = nodes.max_ranks_per_node();
  const std::string give = "; give --shard-size G";
  const std::string why = "hybrid sharding without --shard-size takes one node's data-parallel ranks as a shard group, but ";
  if (!nodes.uniform()) throw UsageError(why + "the nodes hold different numbers of ranks" + give);
  if (!nodes.node_major()) {
    size_t r = 1;
    while (nodes.node_of[r] >= nodes.node_of[r - 1]) ++r;
    throw UsageError(why + "the ranks are not placed node by node (rank " + std::to_string(r) + " is on " +
                     nodes.hosts[size_t(nodes.node_of[r])] + " after rank " + std::to_string(r - 1) + " on " +
                     nodes.hosts[size_t(nodes.node_of[r - 1])] + ": place them by slot, e.g. mpirun --map-by slot, "
                     "srun --distribution=block)" + give);
  }
  if (c.tp < 1 || c.pp < 1 || world % (c.tp * c.pp) != 0) return 1;  // Setup::make names the bad flag
  const int stage = world / c.pp;
  const int block = std::min(per_node, stage);  // one node's ranks of one stage
  if (stage % block != 0 || per_node % block != 0)
    throw UsageError(why + "a node's " + std::to_string(per_node) + " ranks are not a whole number of pipeline stages "
                     "of " + std::to_string(stage) + " ranks or a divisor of one" + give);
  if (block % c.tp != 0)
    throw UsageError(why + "a node's " + std::to_string(block) + " ranks do not hold whole --tp " + std::to_string(c.tp) +
                     " groups" + give);
  return block / c.tp;
}

std::string placement_warning(const ParallelLayout& layout, const NodeMap& nodes, const StrategyConfig& c) {
  const int per_node = nodes.max_ranks_per_node();
  const bool hybrid = c.kind == StrategyKind::FSDP && c.sharding == Sharding::Hybrid;
  for (int r = 0; r < layout.world; ++r) {
    const ParallelLayout at = layout.at_rank(r);
    if (layout.tp > 1 && layout.tp <= per_node)
      if (const std::string s = nodes.spans(at.group(Axis::Tensor)); !s.empty())
        return "a tensor-parallel group crosses nodes: " + s + " (its collectives run on every layer)";
    if (hybrid && layout.shard * layout.tp <= per_node)
      if (const std::string s = nodes.spans(at.group(Axis::Shard)); !s.empty())
        return "a hybrid shard group crosses nodes: " + s + " (its all-gathers leave the node)";
  }
  return "";
}

}  // namespace sb
