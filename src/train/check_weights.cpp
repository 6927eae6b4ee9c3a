// --check: every step of the run against a single-rank reference, with tolerances that follow
// from an error analysis rather than a guess (docs/reliability.md, "The --check").
//
// A reference that trains on its own and compares final weights cannot be right by
// construction: the distributed sum of the ranks' gradients rounds differently from any
// single-rank sum, and Adam's first update is lr·sign(g), so where |g| is below the rounding
// error the two runs move a weight in opposite directions and drift apart. Instead, by
// induction over the steps:
//   1. the initial weights equal the seeded initialisation, bit for bit;
//   2. at step s, rank 0 recomputes each rank's micro-batch gradient at the run's own weights
//      w_s (the same shapes, data and kernels as that rank, so the same values), rounds it
//      into the reduction type R as the run does, and sums the n = world micro-batch
//      gradients exactly (in double). Any order of n−1 additions in R differs from the exact
//      sum by at most γ(n−1)·Σ|g_r| + (n−1)·η (γ(k) = k·u/(1−k·u), u the unit roundoff of
//      R plus fp32's for 16-bit types, which the reductions compute in fp32 and round;
//      η half R's smallest subnormal). The run's reduced gradient must lie within that;
//   3. the optimizer (--optimizer) applied to (w_s, the run's gradient), from a state the
//      reference keeps itself, must give the run's w_{s+1} (the same kernel: equal up to a few
//      roundings; adamw-8bit's blocks are each unit's, as the run's, see the strategies);
//   4. every replica holds the same weights, bit for bit.
// A dropped shard, a wrong reduction factor or stale parameters break 2; a wrong optimizer 3.
//
// Tensor parallelism (--tp N) reorders the sums of the row-parallel layers, so a micro-batch
// gradient of the tensor-parallel model is not the full model's bit for bit. Two references
// then:
//   the tensor-parallel reference: the ranks of the first tensor-parallel group recompute
//     every data-parallel rank's micro-batch with the tensor-parallel model, over a duplicate
//     of their own group's communicator (the same kernels, shapes and collective algorithm
//     as every group, so the same values): 2, 3 and 4 hold against it exactly as above, with
//     n the data-parallel degree; 4 also requires the replicated tensors (norms) to be identical
//     on every rank of a tensor-parallel group;
//   the tensor-parallel model itself: the same group runs it against rank 0's full model in
//     lockstep (train/tp_lockstep.h), on every data-parallel rank's micro-batches: each sum
//     over the group within its rounding bound of the full model's, then set to it; each
//     gradient and the loss equal to the full model's.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include "shardbench/core/check.h"
#include "shardbench/model/t5.h"
#include "shardbench/strategy/pipeline.h"
#include "shardbench/train/check_weights.h"
#include "shardbench/train/reference_step.h"
#include "shardbench/train/tp_lockstep.h"

namespace sb {
namespace {

double unit_roundoff(DType t) {
  switch (t) {
    case DType::BF16: return std::ldexp(1.0, -8) + std::ldexp(1.0, -24);
    case DType::F16: return std::ldexp(1.0, -11) + std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -24);
  }
}
double half_smallest_subnormal(DType t) {
  switch (t) {
    case DType::BF16: return std::ldexp(1.0, -134);
    case DType::F16: return std::ldexp(1.0, -25);
    default: return std::ldexp(1.0, -150);
  }
}
double largest_finite(DType t) {
  switch (t) {
    case DType::BF16: return 3.3895313892515355e38;
    case DType::F16: return 65504.0;
    default: return std::numeric_limits<float>::max();
  }
}

uint64_t fnv1a(const std::vector<std::vector<float>>& units) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& u : units) {
    const auto* p = reinterpret_cast<const unsigned char*>(u.data());
    for (size_t i = 0; i < u.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace

// One model of a reference: the step and its per-unit buffers (reference_step.h).
struct RefModel : ReferenceModel {
  std::vector<Buf> embedding_parts;  // pipeline: the embedding's gradient of each stage holding it
};

// Rank 0's single-rank model: one micro-batch (one data-parallel rank's shapes) at a time.
// With tensor parallelism, instead this rank's part of the tensor-parallel reference (the first group).
struct StepCheck::Reference {
  std::unique_ptr<Backend> b;
  RefModel full;                      // rank 0 without tensor parallelism: the run's dtype
  RefModel tp;                        // the first tensor-parallel group: the run's dtype
  std::vector<float*> p;              // rank 0, per unit: fp32 weights for step 3
  std::vector<char*> state;           // rank 0, per unit: the optimizer's state of the unit as one region
  Buf reduce_buf;                     // one unit in reduce dtype, for the R rounding
  float* f32 = nullptr;               // one unit in fp32
  MPI_Comm tp_mpi = MPI_COMM_NULL;    // a duplicate of the first tensor-parallel group's
  std::unique_ptr<Comm> tp_comm;

  // One micro-batch at a time (the run's micro-batch shape), `parts` embedding gradients.
  void make(RefModel& r, const Setup& setup, DType dtype, float grad_scale, TensorGroup tp, int parts) {
    r.ReferenceModel::make(setup, *b, dtype, grad_scale, tp);  // the run's attention path
    const int64_t numel = r.step->units()[size_t(r.step->pieces()[0].unit)].numel;
    for (int i = 0; i < parts && parts > 1; ++i) r.embedding_parts.push_back(b->alloc_buf(numel, dtype, MemCategory::Gradients));
  }
  void release(RefModel& r) {
    r.ReferenceModel::release(*b);
    for (const Buf& g : r.embedding_parts) b->release(g.ptr);
  }
};

namespace {

// A data-parallel rank's step as the run computes it: each micro-batch's forward then
// backward, the gradients accumulated over them in order (grads[k] = unit k's); a piece
// that uses the embedding adds its part of the embedding's gradient into its pipeline
// stage's part (embedding_part[piece] >= 0) when several stages hold it. The gradient of a
// rank's step (every micro-batch accumulated), or with only >= 0 of that one micro-batch
// alone; returns the loss summed over the micro-batches run.
double forward_backward(Backend& b, RefModel& model, const Tokens& tokens, int micro_batches,
                        const std::vector<int>& embedding_part, int only = -1) {
  const auto& pieces = model.step->pieces();
  const auto& units = model.step->units();
  const int S = int(pieces.size()), embedding = pieces[0].unit;
  for (size_t k = 0; k < units.size(); ++k) b.fill(model.grads[k], 0.f, units[k].numel);
  for (const Buf& g : model.embedding_parts) b.fill(g, 0.f, units[size_t(embedding)].numel);
  double loss = 0;
  for (int m = only < 0 ? 0 : only; m < (only < 0 ? micro_batches : only + 1); ++m) {
    auto slice = [&](const std::vector<int>& v) {
      const size_t n = v.size() / size_t(micro_batches);
      return std::vector<int>(v.begin() + long(n * m), v.begin() + long(n * (m + 1)));
    };
    model.step->set_tokens(micro_batches == 1 ? tokens : Tokens{slice(tokens.enc_ids), slice(tokens.dec_ids),
                                                               slice(tokens.labels)});
    for (int pos = 0; pos < S; ++pos) model.step->forward(pos, by_unit(model.params));
    for (int pi = S - 1; pi >= 0; --pi) {
      const int part = model.embedding_parts.empty() ? -1 : embedding_part[size_t(pi)];
      model.step->backward(pi, by_unit(model.params), [&](int u) {
        return u == embedding && part >= 0 ? model.embedding_parts[size_t(part)] : model.grads[size_t(u)];
      });
    }
    loss += model.step->loss_sum();
  }
  return loss;
}

// Unit k's gradient as the run reduces it (rounded into R), as fp32 on the host.
std::vector<float> reduced_on_host(Backend& b, CBuf grad, int64_t numel, DType R, Buf reduce_buf, float* f32) {
  CBuf reduced = grad;
  if (R != grad.dtype) {  // the run rounds each rank's gradient into R before reducing
    b.cast(reduce_buf, grad, numel);
    reduced = reduce_buf;
  }
  b.cast(f32, reduced, numel);
  std::vector<float> g(numel);
  b.download(g.data(), f32, numel * 4);
  return g;
}

}  // namespace

StepCheck::StepCheck(const RunConfig& cfg, const Setup& setup, Strategy& run, const Mesh& mesh)
    : cfg_(cfg), setup_(setup), run_(run), layout_(mesh.layout), rank_(mesh.layout.rank), world_(mesh.layout.world) {
  const DType P = setup.strategy.param_dtype, R = setup.strategy.reduce_dtype;
  const int n = layout_.dp();  // the gradients summed: one per data-parallel rank
  const double u = unit_roundoff(R);
  gamma_ = (n - 1) * u / (1 - (n - 1) * u);
  eta_ = (n - 1) * half_smallest_subnormal(R);
  u_ = u;
  eta1_ = half_smallest_subnormal(R);
  full_units_ = model_units(setup.model);
  // Pipeline: the pieces that use the embedding, by the holding stage that runs them (each
  // such stage reduces its own part of the embedding's gradient; the parts are then summed).
  const auto& pieces = run.model().pieces();
  embedding_ = pieces[0].unit;
  const std::vector<int> holders = stages_holding(pieces, setup.split, embedding_);
  embedding_parts_ = int(holders.size());
  embedding_part_.assign(pieces.size(), -1);
  for (size_t pi = 0; pi < pieces.size(); ++pi)
    if (pieces_use_unit(pieces, int(pi), int(pi) + 1, embedding_))
      embedding_part_[pi] = int(std::find(holders.begin(), holders.end(), setup.split.stage_of(int(pi))) - holders.begin());
  for (int t = 0; t < layout_.tp; ++t) tp_units_.push_back(model_units(setup.model, {layout_.tp, t}));
  tp_mpi_ = mesh.mpi(Axis::Tensor);
  pp_mpi_ = mesh.mpi(Axis::Pipeline);
  weights_ = gather_weights();
  const bool tensor_parallel = layout_.tp > 1;
  const bool tp_reference = tensor_parallel && layout_.group_index(Axis::Tensor) == 0;
  if (rank_ != 0 && !tp_reference) return;
  ref_ = std::make_unique<Reference>();
  Reference& r = *ref_;
  r.b = make_backend(cfg.backend, cfg.comm);  // the run's library: NCCL refuses ranks sharing a GPU
  r.b->set_compute_options(cfg.compute);       // and the run's kernels
  const float scale = float(1.0 / (double(n) * setup.shape.batch * setup.shape.dec_len)) * setup.strategy.loss_scale;
  int64_t largest = 1;
  for (const UnitSpec& unit : full_units_) largest = std::max(largest, unit.numel);
  r.reduce_buf = r.b->alloc_buf(largest, R, MemCategory::Workspace);
  r.f32 = r.b->alloc_floats(largest, MemCategory::Workspace);
  if (tp_reference) {  // collective over the first tensor-parallel group
    MPI_CHECK(MPI_Comm_dup(tp_mpi_, &r.tp_mpi));
    r.tp_comm = r.b->make_comm(r.tp_mpi);
    r.tp_comm->set_axis(Axis::Tensor);
    const TensorGroup group{layout_.tp, layout_.tp_rank(), r.tp_comm.get()};
    r.make(r.tp, setup, P, scale, group, embedding_parts_);
    lockstep_ = std::make_unique<TpLockstep>(setup, tp_mpi_);  // and the tensor-parallel model itself
  }
  if (rank_ != 0) return;
  // Without tensor parallelism the full model is the reference (the run's dtype).
  if (!tensor_parallel) r.make(r.full, setup, P, scale, {}, embedding_parts_);
  for (const UnitSpec& unit : full_units_) {
    r.p.push_back(r.b->alloc_floats(unit.numel, MemCategory::Parameters));
    // The run's regions are its units (DDP) or their shards, which adamw-8bit pads to whole
    // blocks (FSDP): either way the unit's blocks, so the reference updates each unit as one region.
    const int64_t bytes = optimizer_state_bytes(setup.strategy.optimizer, unit.numel);
    r.state.push_back(static_cast<char*>(r.b->alloc(size_t(std::max<int64_t>(bytes, 8)), MemCategory::OptimizerState)));
    r.b->optimizer_init_state(setup.strategy.optimizer, r.state.back(), unit.numel);
  }
  // 1. The initial weights.
  for (size_t k = 0; k < full_units_.size(); ++k) {
    init_unit_params(*r.b, full_units_[k], setup.strategy.seed, r.f32, 0, full_units_[k].numel);
    std::vector<float> init(full_units_[k].numel);
    r.b->download(init.data(), r.f32, init.size() * 4);
    if (init != weights_[k])
      fail(0, "unit " + full_units_[k].name + ": initial weights differ from the seeded initialisation");
  }
}

StepCheck::~StepCheck() {
  if (!ref_) return;
  Reference& r = *ref_;
  for (RefModel* m : {&r.full, &r.tp}) r.release(*m);
  for (size_t k = 0; k < r.p.size(); ++k)
    for (void* q : {(void*)r.p[k], (void*)r.state[k]}) r.b->release(q);
  r.b->release(r.reduce_buf.ptr);
  r.b->release(r.f32);
  r.tp_comm.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && r.tp_mpi != MPI_COMM_NULL) MPI_Comm_free(&r.tp_mpi);
}

// Unit u of the full model from every tensor-parallel rank's part (`mine` is this rank's);
// collective over the tensor-parallel group. `replicas_differ` is set when a replicated
// tensor (a norm) is not the same on every rank of the group.
std::vector<float> StepCheck::assemble(int u, const std::vector<float>& mine, bool& replicas_differ) {
  const int T = layout_.tp;
  if (T == 1) return mine;
  const int64_t n = int64_t(mine.size());
  std::vector<float> all(size_t(n) * T), full(full_units_[u].numel);
  MPI_CHECK(MPI_Allgather(mine.data(), int(n), MPI_FLOAT, all.data(), int(n), MPI_FLOAT, tp_mpi_));
  for (int t = 0; t < T; ++t) {
    const UnitSpec& part = tp_units_[t][u];
    place_in_full_unit(part, full_units_[u], all.data() + t * n, full.data());
    for (const TensorSpec& ts : part.tensors)
      if (!ts.partitioned() && t > 0)
        replicas_differ |= !std::equal(all.data() + ts.offset, all.data() + ts.offset + ts.numel(),
                                       all.data() + t * n + ts.offset);
  }
  return full;
}

// Unit u as every rank sees it: assembled from its tensor-parallel parts where a stage holds
// it, then sent from the first stage that does to every other (collective over the world).
// Sets `replicas_differ` when the copies of the stages, shard groups or replicas holding it
// are not bit-identical, `tp_copies_differ` when a tensor-parallel group's replicated tensors are not.
std::vector<float> StepCheck::whole_unit(int u, bool gradient, bool& replicas_differ, bool& tp_copies_differ) {
  const bool holds = run_.model().holds_unit(u);
  std::vector<float> w;
  if (holds) w = assemble(u, gradient ? run_.gather_unit_grad(u) : run_.gather_unit(u), tp_copies_differ);
  const uint64_t h = holds ? fnv1a({w}) : 0;
  uint64_t lo = holds ? h : UINT64_MAX, hi = h;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  replicas_differ |= lo != hi;
  if (layout_.pp > 1) {  // from the first stage that holds it
    int owner = holds ? layout_.pp_rank() : layout_.pp;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &owner, 1, MPI_INT, MPI_MIN, pp_mpi_));
    w.resize(size_t(full_units_[u].numel));
    MPI_CHECK(MPI_Bcast(w.data(), int(w.size()), MPI_FLOAT, owner, pp_mpi_));
  }
  return w;
}

std::vector<std::vector<float>> StepCheck::gather_weights() {
  std::vector<std::vector<float>> w;
  bool differ = false, tp_copies_differ = false;
  for (size_t k = 0; k < full_units_.size(); ++k) w.push_back(whole_unit(int(k), false, differ, tp_copies_differ));
  // 4. Replicas (and the ranks of a shard group, and the pipeline stages that share the
  // embedding) hold the same weights, bit for bit; so do the ranks of a tensor-parallel
  // group in the tensors none of them partitions (the norms).
  int flags[2] = {differ, tp_copies_differ};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (flags[0]) fail(steps_, "the ranks' copies of the weights differ (a replica, shard or pipeline stage went its own way)");
  if (flags[1]) fail(steps_, "a replicated tensor differs between the ranks of a tensor-parallel group");
  return w;
}

void StepCheck::fail(int step, const std::string& what) {
  if (rank_ == 0 && failure_.empty()) failure_ = "step " + std::to_string(step) + ": " + what;
}

void StepCheck::before_step(int step) { scale_ = run_.loss_scale(); }

void StepCheck::after_step(int step, bool skipped) {
  steps_ = step;
  std::vector<std::vector<float>> grads;
  bool differ = false, tp_copies_differ = false;  // the reduced gradients' copies: caught with the weights
  for (size_t k = 0; k < full_units_.size(); ++k) grads.push_back(whole_unit(int(k), true, differ, tp_copies_differ));
  std::vector<std::vector<float>> next = gather_weights();
  if (ref_) {
    const MicroBatchSums sums = reference_gradients(step);
    if (rank_ == 0) {
      check_gradients(step, grads, sums, skipped);
      check_update(step, grads, next, skipped);
    }
  }
  weights_ = std::move(next);
}

// 2. The micro-batch gradients of every data-parallel rank at the run's weights, summed
// exactly on rank 0: from the tensor-parallel reference when the run is tensor-parallel (collective
// over the first tensor-parallel group), else from the full model. Under tensor parallelism
// the group also runs each data-parallel rank's step in the lockstep (tp_lockstep.h).
StepCheck::MicroBatchSums StepCheck::reference_gradients(int step) {
  Reference& r = *ref_;
  const DType R = setup_.strategy.reduce_dtype;
  const size_t U = full_units_.size();
  const int T = layout_.tp;
  const float scale = float(1.0 / (double(layout_.dp()) * setup_.shape.batch * setup_.shape.dec_len)) * scale_;
  // Unit k's gradient of `m` summed over its tensor-parallel ranks' parts (rank 0; -R: as
  // the run reduces it), added into sum (and |.| into abs).
  auto accumulate = [&](RefModel& m, DType round_to, std::vector<std::vector<double>>& sum,
                        std::vector<std::vector<double>>* abs, bool& nonfinite) {
    const bool partitioned = m.step->tensor_group().size > 1;
    for (size_t k = 0; k < U; ++k) {
      const int64_t numel = m.step->units()[k].numel;
      // The terms the run reduces: the unit's gradient, or the embedding's part of each stage.
      const bool parts = int(k) == embedding_ && !m.embedding_parts.empty();
      const std::vector<Buf> terms = parts ? m.embedding_parts : std::vector<Buf>{m.grads[k]};
      for (const Buf& term : terms) {
        std::vector<float> g = reduced_on_host(*r.b, term, numel, round_to, r.reduce_buf, r.f32);
        if (partitioned) {
          std::vector<float> all(rank_ == 0 ? size_t(numel) * T : 0);
          MPI_CHECK(MPI_Gather(g.data(), int(numel), MPI_FLOAT, all.data(), int(numel), MPI_FLOAT, 0, r.tp_mpi));
          if (rank_ != 0) continue;
          g.assign(full_units_[k].numel, 0.f);
          for (int t = 0; t < T; ++t)
            place_in_full_unit(tp_units_[t][k], full_units_[k], all.data() + t * numel, g.data());
        }
        if (sum[k].empty()) sum[k].assign(g.size(), 0.0);
        if (abs && (*abs)[k].empty()) (*abs)[k].assign(g.size(), 0.0);
        for (size_t i = 0; i < g.size(); ++i) {
          nonfinite |= !std::isfinite(g[i]);
          sum[k][i] += g[i];
          if (abs) (*abs)[k][i] += std::fabs(g[i]);
        }
      }
    }
  };
  std::vector<RefModel*> models;
  for (RefModel* m : {&r.tp, &r.full})
    if (m->step) {
      m->step->set_grad_scale(scale);
      for (size_t k = 0; k < U; ++k) {
        const UnitSpec& part = m->step->units()[k];
        const std::vector<float> w =
            part.numel == full_units_[k].numel ? weights_[k] : take_from_full_unit(part, full_units_[k], weights_[k]);
        r.b->upload(r.f32, w.data(), w.size() * 4);
        r.b->cast(m->params[k], r.f32, part.numel);
      }
      models.push_back(m);
    }
  MicroBatchSums sums;
  sums.sum.resize(U), sums.abs_sum.resize(U);
  for (int dp_rank = 0; dp_rank < layout_.dp(); ++dp_rank) {
    const Tokens tokens =
        make_tokens(setup_.strategy.seed, step, int64_t(dp_rank) * setup_.shape.batch, setup_.shape, setup_.model.vocab);
    for (RefModel* m : models) {
      const int M = setup_.strategy.micro_batches;
      if (setup_.strategy.reduces_every_micro_batch()) {
        // Sharded accumulation reduces each micro-batch's gradient: one term per micro-batch.
        for (int mb = 0; mb < M; ++mb) {
          forward_backward(*r.b, *m, tokens, M, embedding_part_, mb);
          accumulate(*m, R, sums.sum, &sums.abs_sum, sums.micro_nonfinite);
        }
      } else {
        forward_backward(*r.b, *m, tokens, M, embedding_part_);
        accumulate(*m, R, sums.sum, &sums.abs_sum, sums.micro_nonfinite);
      }
    }
    if (lockstep_) {
      const std::string diff = lockstep_->check(weights_, tokens, scale);
      if (!diff.empty() && tp_failure_.empty()) {
        tp_failure_ = "step " + std::to_string(step) + ": data-parallel rank " + std::to_string(dp_rank) +
                      "'s step, " + diff;
        fail(step, "the tensor-parallel model departs from the full model (its first difference above)");
      }
    }
  }
  return sums;
}

void StepCheck::check_gradients(int step, const std::vector<std::vector<float>>& grads, const MicroBatchSums& ref,
                                bool skipped) {
  const DType R = setup_.strategy.reduce_dtype;
  const auto& units = full_units_;
  const int n = layout_.dp();
  // The loss scaler's verdict: overflow is certain when a micro-batch gradient is not finite
  // or an exact sum exceeds R's range; impossible when even Σ|g| (which bounds every
  // partial sum) fits with room for the rounding; either in between.
  const double top = largest_finite(R);
  bool must_skip = ref.micro_nonfinite, may_skip = ref.micro_nonfinite, run_nonfinite = false;
  for (size_t k = 0; k < units.size(); ++k)
    for (size_t i = 0; i < grads[k].size(); ++i) {
      run_nonfinite |= !std::isfinite(grads[k][i]);
      must_skip |= std::fabs(ref.sum[k][i]) > top * (1 + gamma_);
      may_skip |= ref.abs_sum[k][i] * (1 + gamma_) >= top;
    }
  if (skipped != run_nonfinite) fail(step, skipped ? "the update was skipped although the gradients are finite"
                                                   : "the gradients are not finite but the update was not skipped");
  if (skipped && !may_skip) fail(step, "the update was skipped, but the reference's gradients cannot overflow");
  if (!skipped && must_skip) fail(step, "the reference's gradients overflow, but the update was not skipped");
  if (skipped) return;
  const double tol = cfg_.check_tolerance;
  for (size_t k = 0; k < units.size(); ++k) {
    // The terms summed: one per data-parallel rank; for the embedding under pipeline
    // parallelism one per rank and stage holding it (each stage reduces its part); with
    // sharded accumulation, each of those per micro-batch.
    const int terms = n * (int(k) == embedding_ ? embedding_parts_ : 1) *
                      (setup_.strategy.reduces_every_micro_batch() ? setup_.strategy.micro_batches : 1);
    const double gamma = (terms - 1) * u_ / (1 - (terms - 1) * u_), eta = (terms - 1) * eta1_;
    for (size_t i = 0; i < grads[k].size(); ++i) {
      // (+ the double sum's own rounding, terms·2^-53·Σ|g|, for rigour)
      const double bound = (gamma + terms * std::ldexp(1.0, -53)) * ref.abs_sum[k][i] + eta;
      const double err = std::fabs(double(grads[k][i]) - ref.sum[k][i]);
      const double ratio = err == 0 ? 0.0 : bound == 0 ? std::numeric_limits<double>::infinity() : err / bound;
      if (!(ratio <= worst_ratio_)) {
        worst_ratio_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
        if (!(ratio <= tol)) {
          char text[256];
          std::snprintf(text, sizeof text,
                        "unit %s element %zu: reduced gradient %.9g, reference %.9g, allowed difference %.3g "
                        "(error %.3g x the rounding bound)",
                        units[k].name.c_str(), i, double(grads[k][i]), ref.sum[k][i], bound * tol, ratio);
          fail(step, text);
        }
      }
      undetermined_ += std::fabs(ref.sum[k][i]) <= bound && ref.sum[k][i] != 0;
      checked_ += 1;
    }
  }
}
// 3. The optimizer (with the reference's own state) on the run's gradients at the run's
// weights gives the run's next weights.
void StepCheck::check_update(int step, const std::vector<std::vector<float>>& grads,
                             const std::vector<std::vector<float>>& next, bool skipped) {
  Reference& r = *ref_;
  const auto& units = full_units_;
  OptimizerConfig opt = setup_.strategy.optimizer;
  opt.grad_unscale = 1.f / scale_;
  std::vector<float> expect;
  for (size_t k = 0; k < units.size(); ++k) {
    const int64_t numel = units[k].numel;
    if (skipped) {
      if (next[k] != weights_[k]) fail(step, "unit " + units[k].name + " changed in a skipped step");
      continue;
    }
    r.b->upload(r.p[k], weights_[k].data(), numel * 4);
    r.b->upload(r.f32, grads[k].data(), numel * 4);
    r.b->cast(r.reduce_buf, r.f32, numel);  // exact: the values came from R
    r.b->optimizer_update(opt, step, r.p[k], r.reduce_buf, r.state[k], numel);
    expect.resize(numel);
    r.b->download(expect.data(), r.p[k], numel * 4);
    for (int64_t i = 0; i < numel; ++i) {
      // The same kernel on the same inputs; a vectorised and a scalar path may round the
      // moments and the update differently: a few roundings of the weight and the update.
      const double w = next[k][i], e = expect[i];
      const double allowed = 4 * std::ldexp(1.0, -24) * (std::fabs(e) + 8 * std::fabs(e - weights_[k][i]));
      const double diff = std::fabs(w - e);
      max_update_diff_ = std::max(max_update_diff_, diff);
      if (!(diff <= allowed)) {
        char text[256];
        std::snprintf(text, sizeof text, "unit %s element %" PRId64 ": weight %.9g after %s, expected %.9g",
                      units[k].name.c_str(), i, w, optimizer_name(opt.kind), e);
        fail(step, text);
        break;
      }
    }
  }
}

bool StepCheck::finish(double& worst_ratio) {
  int ok = failure_.empty();
  MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
  worst_ratio = worst_ratio_;
  MPI_CHECK(MPI_Bcast(&worst_ratio, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  if (rank_ == 0) {
    std::printf(
        "check: %d steps against a single-rank reference (the steps of %d data-parallel ranks recomputed on 1 rank): gradients "
        "within %.3g x their rounding bound (allowed %.3g; %lld of %lld gradients are below their bound, where "
        "Adam's sign is set by rounding), %s updates within %.3g, replicas identical -> %s\n",
        steps_, layout_.dp(), worst_ratio_, cfg_.check_tolerance, (long long)undetermined_, (long long)checked_,
        optimizer_name(setup_.strategy.optimizer.kind), max_update_diff_, ok ? "PASS" : "FAIL");
    if (lockstep_)
      std::printf("check: tensor parallelism: the split reference on ranks 0-%d; against the full model in "
                  "lockstep (fp32, every product and sum rounded once): %lld sums over the group (%lld elements) "
                  "within %.3g x their rounding bound; gradients (%lld elements) and losses compared for equality -> %s\n",
                  layout_.tp - 1, lockstep_->sums(), lockstep_->sum_elements(), lockstep_->worst_ratio(),
                  lockstep_->gradient_elements(), tp_failure_.empty() ? "PASS" : "FAIL");
    if (!tp_failure_.empty()) std::printf("check: tensor parallelism: first difference: %s\n", tp_failure_.c_str());
    if (!ok) std::printf("check: first failure: %s\n", failure_.c_str());
    std::fflush(stdout);
  }
  return ok;
}

}  // namespace sb
