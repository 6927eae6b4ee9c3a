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
  const std::string tensor = (tp > 1 ? "-tp" + std::to_string(tp) : "") + (pp > 1 ? "-pp" + std::to_string(pp) : "");
  if (kind == StrategyKind::DDP) return "ddp" + tensor;
  std::string l = std::string("fsdp-") + sharding_name(sharding);
  if (sharding == Sharding::Hybrid) l += std::to_string(shard_size);
  return l + tensor;
}

ParallelLayout layout_for(const StrategyConfig& c, int world, int rank) {
  const int tp = c.tp, pp = c.pp;
  if (tp < 1 || world % tp != 0)
    throw UsageError("--tp " + std::to_string(tp) + " is not allowed with world size " + std::to_string(world) +
                     " (must divide it: dp x tp = world)");
  if (pp < 1 || world % pp != 0 || (world / pp) % tp != 0)
    throw UsageError("--pp " + std::to_string(pp) + " is not allowed with world size " + std::to_string(world) +
                     (tp > 1 ? " and --tp " + std::to_string(tp) : std::string()) +
                     " (must divide it: pp x dp x tp = world)");
  int shard = 1;
  if (c.kind == StrategyKind::FSDP && (c.sharding == Sharding::Full || c.sharding == Sharding::GradOp))
    shard = world / (tp * pp);
  if (c.kind == StrategyKind::FSDP && c.sharding == Sharding::Hybrid) shard = c.shard_size;
  return ParallelLayout::make(world, rank, shard, tp, pp);
}

PipelineSplit pipeline_split(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape) {
  const int L = int(spec.layers);
  if (c.pp == 1) return PipelineSplit{{0, 2 * L + 3}};
  std::vector<double> cost;
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_encoder_block(spec, shape, c.tp));
  for (int l = 0; l < L; ++l) cost.push_back(forward_flops_decoder_block(spec, shape, c.tp));
  cost.back() += forward_flops_head(spec, shape, c.tp);
  return split_pipeline(cost, L, c.pp, c.pp_split);
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
// One micro-batch of a data-parallel rank's step shape.
StepShape micro_shape(const StepShape& shape, int micro_batches) {
  SB_ASSERT(shape.batch % micro_batches == 0, "micro-batches must divide the batch");
  return {shape.batch / micro_batches, shape.enc_len, shape.dec_len};
}
PipelinePart part_of(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape, const Mesh& mesh) {
  const PipelineSplit split = pipeline_split(c, spec, shape);
  const int s = mesh.layout.pp_rank();
  return {split.first[size_t(s)], split.first[size_t(s) + 1], c.micro_batches};
}
// Sequences m·B/M .. (m+1)·B/M − 1 of a rank's tokens.
Tokens micro_tokens(const Tokens& t, int micro, int micro_batches) {
  if (micro_batches == 1 || t.enc_ids.empty()) return t;
  auto slice = [&](const std::vector<int>& v) {
    const size_t n = v.size() / size_t(micro_batches);
    return std::vector<int>(v.begin() + long(n * micro), v.begin() + long(n * (micro + 1)));
  };
  return Tokens{slice(t.enc_ids), slice(t.dec_ids), slice(t.labels)};
}
// Tags of the pipeline's transfers: the direction in the lowest bit (the CUDA backend runs
// each direction on a stream of its own), then the tensor of the cut, then the micro-batch.
int transfer_tag(int micro, int tensor, bool gradient) { return ((micro * 8 + tensor) << 1) | int(gradient); }
}  // namespace

TrainingSchedule::TrainingSchedule(const StrategyConfig& cfg, const ModelSpec& spec, Backend& b,
                                   Mesh& mesh, const StepShape& shape)
    : cfg_(cfg),
      b_(b),
      mesh_(mesh),
      part_(part_of(cfg, spec, shape, mesh)),
      model_(spec, b, cfg.param_dtype, micro_shape(shape, cfg.micro_batches), cfg.checkpointing,
             grad_scale(shape, mesh.layout.dp()) * cfg.loss_scale, cfg.attention, tensor_group(mesh), part_),
      units_(model_.units()),
      unit_stages_(units_.size()),
      stage_(mesh.layout.pp_rank()),
      stages_(mesh.layout.pp),
      sent_(size_t(cfg.micro_batches)),
      base_grad_scale_(grad_scale(shape, mesh.layout.dp())),
      scale_(cfg.loss_scale) {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!model_.holds_unit(int(u))) units_[u] = UnitSpec{units_[u].kind, units_[u].layer, units_[u].name, {}, 0};
  for (int pos = forward_begin(); pos < forward_end(); ++pos) {
    UnitStages& f = unit_stages_[forward_unit(pos)];
    if (f.first_forward < 0) f.first_forward = pos;
    f.last_forward = pos;
  }
  for (int pos = backward_begin(); pos < backward_end(); ++pos) {
    UnitStages& r = unit_stages_[backward_unit(pos)];
    if (r.first_backward < 0) r.first_backward = pos;
    r.last_backward = pos;
  }
  if (stages_ == 1) return;
  // The stages that hold the root unit sum its gradients (one of them without: no group).
  const PipelineSplit split = pipeline_split(cfg, spec, shape);
  int holders = 0, mine = -1;
  for (int s = 0; s < stages_; ++s) {
    bool holds = false;
    for (int k = split.first[size_t(s)]; k < split.first[size_t(s) + 1]; ++k) holds |= model_.stages()[k].unit == 0;
    if (s == stage_ && holds) mine = holders;
    holders += holds;
  }
  const MPI_Comm pipeline = mesh.mpi(Axis::Pipeline);
  if (pipeline == MPI_COMM_NULL) {  // a planned mesh
    pp_grads_ = make_planned_comm(stages_, stage_);
    if (holders > 1 && mine >= 0) root_comm_ = make_planned_comm(holders, mine);
  } else {
    MPI_CHECK(MPI_Comm_dup(pipeline, &pp_grads_mpi_));
    pp_grads_ = b.make_comm(pp_grads_mpi_);
    if (holders > 1) {
      MPI_CHECK(MPI_Comm_split(pipeline, mine >= 0 ? 0 : MPI_UNDEFINED, stage_, &root_mpi_));
      if (mine >= 0) root_comm_ = b.make_comm(root_mpi_);
    }
  }
  pp_grads_->set_axis(Axis::Pipeline);
  if (root_comm_) root_comm_->set_axis(Axis::Pipeline);
}

TrainingSchedule::~TrainingSchedule() {
  root_comm_.reset();
  pp_grads_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&pp_grads_mpi_, &root_mpi_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

// A forward action: the stage's inputs from the previous stage, its model stages' forward,
// its outputs to the next stage (sent without waiting: the micro-batch's backward waits).
void TrainingSchedule::forward_micro(int m) {
  Comm& pp = mesh_.comm(Axis::Pipeline);
  if (stage_ > 0) {
    ScopedContext ctx(b_, Phase::Forward, forward_unit(forward_begin()));
    std::vector<Request> in;
    const auto cut = model_.cut(forward_begin());
    for (size_t i = 0; i < cut.size(); ++i)
      in.push_back(b_.recv(model_.cut_input(forward_begin(), m, int(i)), cut[i].numel, stage_ - 1,
                           transfer_tag(m, int(i), false), pp));
    for (Request r : in) b_.wait(r);
  }
  for (int pos = forward_begin(); pos < forward_end(); ++pos) {
    const int u = forward_unit(pos);
    ScopedContext ctx(b_, Phase::Forward, u);
    before_forward(pos);
    model_.forward(pos, params_for(u), m);
    after_forward(pos);
  }
  if (stage_ < stages_ - 1) {
    ScopedContext ctx(b_, Phase::Forward, forward_unit(forward_end() - 1));
    const auto cut = model_.cut(forward_end());
    for (size_t i = 0; i < cut.size(); ++i)
      sent_[size_t(m)].push_back(b_.send(model_.cut_output(forward_end(), m, int(i)), cut[i].numel, stage_ + 1,
                                         transfer_tag(m, int(i), false), pp));
  }
}

// A backward action: the outputs' gradients from the next stage, the model stages' backward
// in reverse, the inputs' gradients to the previous stage (from a copy: the model reuses its
// gradient buffers in the next action; the copy is freed once the send has read it).
void TrainingSchedule::backward_micro(int m) {
  for (Request r : sent_[size_t(m)]) b_.wait(r);  // received long since: its buffers may go
  sent_[size_t(m)].clear();
  if (stage_ < stages_ - 1) {
    ScopedContext ctx(b_, Phase::Backward, forward_unit(forward_end() - 1));
    std::vector<Request> in;
    const auto cut = model_.cut(forward_end());
    for (size_t i = 0; i < cut.size(); ++i)
      in.push_back(b_.recv(model_.cut_grad_input(forward_end(), int(i)), cut[i].grad_numel, stage_ + 1,
                           transfer_tag(m, int(i), true), *pp_grads_));
    for (Request r : in) b_.wait(r);
  }
  for (int pos = backward_begin(); pos < backward_end(); ++pos) {
    const int u = backward_unit(pos);
    ScopedContext ctx(b_, Phase::Backward, u);
    before_backward(pos);
    model_.backward(backward_stage(pos), params_for(u), grads_for(u), m);
    after_backward(pos);
  }
  if (stage_ > 0) {
    ScopedContext ctx(b_, Phase::Backward, forward_unit(forward_begin()));
    const auto cut = model_.cut(forward_begin());
    for (size_t i = 0; i < cut.size(); ++i) {
      const CBuf g = model_.cut_grad_output(forward_begin(), int(i));
      const Buf copy = b_.alloc_buf(cut[i].grad_numel, g.dtype, MemCategory::CommBuffers);
      b_.copy(copy, g, cut[i].grad_numel);
      const Request r = b_.send(copy, cut[i].grad_numel, stage_ - 1, transfer_tag(m, int(i), true), *pp_grads_);
      b_.release_after(copy.ptr, r);
      grad_sends_.push_back(r);
    }
  }
  ++backward_count_;
}

// Megatron-LM's embedding group: every stage that holds the root unit adds the others'
// gradients of it (each already reduced over the data-parallel ranks), in the reduce dtype.
void TrainingSchedule::sum_tied_root() {
  if (!root_comm_) return;
  int64_t n = 0;
  const Buf g = reduced_gradient(0, n);
  ScopedContext ctx(b_, Phase::Backward, 0);
  if (n > 0) b_.wait(b_.all_reduce(g, n, *root_comm_));
}

double TrainingSchedule::step(int step, const Tokens& tokens) {
  for (int m = 0; m < cfg_.micro_batches; ++m) model_.set_tokens(micro_tokens(tokens, m, cfg_.micro_batches), m);
  model_.set_grad_scale(base_grad_scale_ * scale_);
  backward_count_ = 0;
  for (const PipeAction& a : pipeline_actions(cfg_.pp_schedule, stages_, stage_, cfg_.micro_batches)) {
    if (a.kind == PipeAction::Forward) forward_micro(a.micro);
    else backward_micro(a.micro);
  }
  {
    ScopedContext ctx(b_, Phase::Backward, -1);
    for (Request r : grad_sends_) b_.wait(r);
    grad_sends_.clear();
    finish_gradients();
  }
  sum_tied_root();
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
