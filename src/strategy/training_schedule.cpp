// The one training-step loop every strategy runs, and the strategy factory.
#include "shardbench/strategy/training_schedule.h"

#include <string>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"

namespace sb {

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
PipelinePart part_of(const StrategyConfig& c, const PipelineSplit& split, const Mesh& mesh) {
  const int s = mesh.layout.pp_rank();
  return {split.first[size_t(s)], split.first[size_t(s) + 1], c.micro_batches,
          std::vector<int>(split.first.begin(), split.first.end() - 1)};
}
// The step this rank runs: one micro-batch of its pipeline stage's pieces, in its
// tensor-parallel group, the loss gradient scaled for the global mean and the loss scale.
T5StepConfig step_config(const StrategyConfig& c, const ModelSpec& spec, const StepShape& shape, const Mesh& mesh,
                         const PipelinePart& part) {
  T5StepConfig s;
  s.spec = spec;
  s.dtype = c.param_dtype;
  s.shape = micro_shape(shape, c.micro_batches);
  s.checkpointing = c.checkpointing;
  s.grad_scale = grad_scale(shape, mesh.layout.dp()) * c.loss_scale;
  s.attention = c.attention;
  s.tp = tensor_group(mesh);
  s.part = part;
  s.units = c.unit_cache;
  return s;
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
}  // namespace

TrainingSchedule::TrainingSchedule(const Setup& setup, Backend& b, Mesh& mesh)
    : cfg_(setup.strategy),
      b_(b),
      mesh_(mesh),
      part_(part_of(setup.strategy, setup.split, mesh)),
      model_(b, step_config(setup.strategy, setup.model, setup.shape, mesh, part_)),
      units_(model_.units()),
      unit_pieces_(units_.size()),
      pipeline_(b, mesh, model_, setup.split, setup.strategy.micro_batches),
      params_of_([this](int u) { return params_for(u); }),
      grads_of_([this](int u) { return grads_for(u); }),
      base_grad_scale_(grad_scale(setup.shape, mesh.layout.dp())),
      scale_(setup.strategy.loss_scale) {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!model_.holds_unit(int(u))) units_[u] = UnitSpec{units_[u].kind, units_[u].layer, units_[u].name, {}, 0};
  for (int pos = forward_begin(); pos < forward_end(); ++pos)
    for (int u : forward_units(pos)) {
      UnitPieces& f = unit_pieces_[size_t(u)];
      if (f.first_forward < 0) f.first_forward = pos;
      f.last_forward = pos;
    }
  for (int pos = backward_begin(); pos < backward_end(); ++pos)
    for (int u : backward_units(pos)) {
      UnitPieces& r = unit_pieces_[size_t(u)];
      if (r.first_backward < 0) r.first_backward = pos;
      r.last_backward = pos;
    }
}

// A forward action: the stage's inputs, its pieces' forward, its outputs on.
void TrainingSchedule::forward_micro(int m) {
  pipeline_.receive_inputs(m);
  for (int pos = forward_begin(); pos < forward_end(); ++pos) {
    const int u = forward_unit(pos);
    ScopedContext ctx(b_, Phase::Forward, u);
    before_forward(pos);
    model_.forward(pos, params_of_, m);
    after_forward(pos);
  }
  pipeline_.send_outputs(m);
}

// A backward action: the outputs' gradients, the pieces' backward in reverse, the
// inputs' gradients back.
void TrainingSchedule::backward_micro(int m) {
  pipeline_.receive_output_grads(m);
  for (int pos = backward_begin(); pos < backward_end(); ++pos) {
    const int u = backward_unit(pos);
    ScopedContext ctx(b_, Phase::Backward, u);
    before_backward(pos);
    model_.backward(backward_piece(pos), params_of_, grads_of_, m);
    after_backward(pos);
  }
  pipeline_.send_input_grads(m);
  ++backward_count_;
}

void TrainingSchedule::sum_embedding() {
  if (!pipeline_.sums_embedding()) return;
  int64_t n = 0;
  const Buf g = reduced_gradient(model_.pieces()[0].unit, n);
  pipeline_.sum_embedding(g, n);
}

double TrainingSchedule::step(int step, const Tokens& tokens) {
  for (int m = 0; m < cfg_.micro_batches; ++m) model_.set_tokens(micro_tokens(tokens, m, cfg_.micro_batches), m);
  model_.set_grad_scale(base_grad_scale_ * scale_);
  backward_count_ = 0;
  for (const PipeAction& a : pipeline_actions(cfg_.pp_schedule, pipeline_.stages(), pipeline_.stage(), cfg_.micro_batches)) {
    if (a.kind == PipeAction::Forward) forward_micro(a.micro);
    else backward_micro(a.micro);
  }
  {
    ScopedContext ctx(b_, Phase::Backward, -1);
    pipeline_.wait_sends();
    finish_gradients();
  }
  sum_embedding();
  if (injected_fault(Fault::DropGradShard) && mesh_.layout.rank == mesh_.layout.world - 1) {
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
    cfg_.optimizer.grad_unscale = 1.f / scale_;
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

std::unique_ptr<Strategy> make_ddp(const Setup&, Backend&, Mesh&);
std::unique_ptr<Strategy> make_fsdp(const Setup&, Backend&, Mesh&);

std::unique_ptr<Strategy> make_strategy(const Setup& setup, Backend& backend, Mesh& mesh) {
  if (setup.strategy.kind == StrategyKind::DDP) return make_ddp(setup, backend, mesh);
  return make_fsdp(setup, backend, mesh);
}

}  // namespace sb
