// The one training-step loop every strategy runs, and the strategy names and factory.
#include <string>

#include "shardbench/core/check.h"
#include "shardbench/strategy/strategy.h"

namespace sb {

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::Full: return "full";
    case Sharding::Hybrid: return "hybrid";
    case Sharding::None: return "none";
    case Sharding::GradOp: return "grad-op";
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
  for (Sharding v : {Sharding::Full, Sharding::Hybrid, Sharding::None, Sharding::GradOp})
    if (s == sharding_name(v)) return v;
  throw UsageError("--sharding '" + s + "' is not allowed (allowed: full, hybrid, none, grad-op)");
}

Prefetch parse_prefetch(const std::string& s) {
  for (Prefetch v : {Prefetch::None, Prefetch::BackwardPre, Prefetch::BackwardPost})
    if (s == prefetch_name(v)) return v;
  throw UsageError("--prefetch '" + s + "' is not allowed (allowed: none, backward-pre, backward-post)");
}

std::string StrategyConfig::label() const {
  const std::string tensor = tp > 1 ? "-tp" + std::to_string(tp) : "";
  if (kind == StrategyKind::DDP) return "ddp" + tensor;
  std::string l = std::string("fsdp-") + sharding_name(sharding);
  if (sharding == Sharding::Hybrid) l += std::to_string(shard_size);
  return l + tensor;
}

ParallelLayout layout_for(const StrategyConfig& c, int world, int rank) {
  const int tp = c.tp;
  if (tp < 1 || world % tp != 0)
    throw UsageError("--tp " + std::to_string(tp) + " is not allowed with world size " + std::to_string(world) +
                     " (must divide it: dp x tp = world)");
  int shard = 1;
  if (c.kind == StrategyKind::FSDP && (c.sharding == Sharding::Full || c.sharding == Sharding::GradOp))
    shard = world / tp;
  if (c.kind == StrategyKind::FSDP && c.sharding == Sharding::Hybrid) shard = c.shard_size;
  return ParallelLayout::make(world, rank, shard, tp);
}

namespace {
float grad_scale(const StepShape& shape, int data_parallel) {
  // Mean over every decoder token of the global batch: summing the data-parallel ranks'
  // gradients (all-reduce or reduce-scatter with SUM) then gives the global mean.
  return float(1.0 / (double(data_parallel) * shape.batch * shape.dec_len));
}
TensorGroup tensor_group(const Mesh& mesh) {
  const ParallelLayout& l = mesh.layout;
  return {l.tp, l.tp_rank(), l.tp > 1 ? &mesh.comm(Axis::Tensor) : nullptr};
}
}  // namespace

TrainingSchedule::TrainingSchedule(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b,
                                   Mesh& mesh, const StepShape& shape)
    : cfg_(cfg),
      b_(b),
      mesh_(mesh),
      model_(spec, b, cfg.param_dtype, shape, cfg.checkpointing, grad_scale(shape, mesh.layout.dp()) * cfg.loss_scale,
             cfg.attention, tensor_group(mesh)),
      units_(model_.units()),
      unit_stages_(units_.size()),
      base_grad_scale_(grad_scale(shape, mesh.layout.dp())),
      scale_(cfg.loss_scale) {
  for (int pos = 0; pos < num_stages(); ++pos) {
    UnitStages& f = unit_stages_[forward_unit(pos)];
    if (f.first_forward < 0) f.first_forward = pos;
    f.last_forward = pos;
    UnitStages& r = unit_stages_[backward_unit(pos)];
    if (r.first_backward < 0) r.first_backward = pos;
    r.last_backward = pos;
  }
}

double TrainingSchedule::step(int step, const Tokens& tokens) {
  model_.set_tokens(tokens);
  model_.set_grad_scale(base_grad_scale_ * scale_);
  for (int pos = 0; pos < num_stages(); ++pos) {
    const int u = forward_unit(pos);
    ScopedContext ctx(b_, Phase::Forward, u);
    before_forward(pos);
    model_.forward(pos, params_for(u));
    after_forward(pos);
  }
  for (int pos = 0; pos < num_stages(); ++pos) {
    const int u = backward_unit(pos);
    ScopedContext ctx(b_, Phase::Backward, u);
    before_backward(pos);
    model_.backward(backward_stage(pos), params_for(u), grads_for(u));
    after_backward(pos);
  }
  {
    ScopedContext ctx(b_, Phase::Backward, -1);
    finish_gradients();
  }
  if (injected_fault("drop-grad-shard") && mesh_.layout.rank == mesh_.layout.world - 1) {
    int64_t n = 0;
    const CBuf g = reduced_gradients(n);
    b_.fill(Buf(const_cast<void*>(g.ptr), g.dtype), 0.f, n / 4);
  }
  ScopedContext ctx(b_, Phase::Optimizer, -1);
  skipped_ = cfg_.dynamic_loss_scale && !gradients_finite();
  if (skipped_) {  // GradScaler: skip the update, back off
    scale_ *= 0.5f;
    good_steps_ = 0;
  } else {
    cfg_.adam.grad_unscale = 1.f / scale_;
    optimizer_step(step);
    if (cfg_.dynamic_loss_scale && ++good_steps_ == cfg_.loss_scale_growth_interval) {
      scale_ *= 2.f;
      good_steps_ = 0;
    }
  }
  b_.synchronize();
  // Read after the step, not between forward and backward: on a GPU the download would
  // synchronise the host in the middle of the step.
  return model_.loss_sum();
}

// The ranks of a shard group, tensor-parallel group and pipeline hold different parts of the
// reduced gradients (replicas hold the same parts), so the whole world agrees on one answer.
bool TrainingSchedule::gradients_finite() {
  int64_t n = 0;
  const CBuf g = reduced_gradients(n);
  int finite = b_.all_finite(g, n) ? 1 : 0;
  if (mesh_.world() != MPI_COMM_NULL)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &finite, 1, MPI_INT, MPI_MIN, mesh_.world()));
  return finite == 1;
}

std::unique_ptr<Strategy> make_ddp(const StrategyConfig&, const ModelSpec&, Backend&, Mesh&,
                                   const StepShape&);
std::unique_ptr<Strategy> make_fsdp(const StrategyConfig&, const ModelSpec&, Backend&, Mesh&,
                                    const StepShape&);

std::unique_ptr<Strategy> make_strategy(const StrategyConfig& cfg, const ModelSpec& spec,
                                        Backend& backend, Mesh& mesh, const StepShape& shape) {
  if (cfg.kind == StrategyKind::DDP) return make_ddp(cfg, spec, backend, mesh, shape);
  return make_fsdp(cfg, spec, backend, mesh, shape);
}

}  // namespace sb
