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
//   3. Adam applied to (w_s, the run's gradient) must give the run's w_{s+1} (the same
//      elementwise kernel: equal up to a few roundings);
//   4. every replica holds the same weights, bit for bit.
// A dropped shard, a wrong reduction factor or stale parameters break 2; a wrong optimizer 3.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include "shardbench/core/check.h"
#include "shardbench/model/t5.h"
#include "shardbench/train/check_weights.h"

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

// Rank 0's single-rank model: one micro-batch (one rank's shapes) at a time.
struct StepCheck::Reference {
  std::unique_ptr<Backend> b;
  std::unique_ptr<T5Step> model;
  std::vector<Buf> params, grads;     // per unit, param dtype
  std::vector<float*> p, m, v;        // per unit: fp32 weights and Adam moments for step 3
  Buf reduce_buf;                     // one unit in reduce dtype, for the R rounding
  float* f32 = nullptr;               // one unit in fp32
  std::vector<int> first_backward;    // per unit: its first position in backward order
};

StepCheck::StepCheck(const RunConfig& cfg, Strategy& run, int rank, int world)
    : cfg_(cfg), run_(run), rank_(rank), world_(world) {
  const DType P = cfg.strategy.param_dtype, R = cfg.strategy.reduce_dtype;
  const int n = world;
  const double u = unit_roundoff(R);
  gamma_ = (n - 1) * u / (1 - (n - 1) * u);
  eta_ = (n - 1) * half_smallest_subnormal(R);
  weights_ = gather_weights();
  if (rank_ != 0) return;
  ref_ = std::make_unique<Reference>();
  Reference& r = *ref_;
  r.b = make_backend(cfg.backend, cfg.comm);  // the run's library: NCCL refuses ranks sharing a GPU
  r.b->set_compute_options(cfg.compute);       // and the run's kernels
  const float base = float(1.0 / (double(world) * cfg.shape.batch * cfg.shape.dec_len));
  r.model = std::make_unique<T5Step>(cfg.model, *r.b, P, cfg.shape, cfg.strategy.checkpointing,
                                     base * cfg.strategy.loss_scale, cfg.strategy.attention);  // the run's path
  const auto& units = r.model->units();
  int64_t largest = 1;
  for (size_t k = 0; k < units.size(); ++k) {
    const int64_t numel = units[k].numel;
    largest = std::max(largest, numel);
    r.params.push_back(r.b->alloc_buf(numel, P, MemCategory::Parameters));
    r.grads.push_back(r.b->alloc_buf(numel, P, MemCategory::Gradients));
    r.p.push_back(r.b->alloc_floats(numel, MemCategory::Parameters));
    r.m.push_back(r.b->alloc_floats(numel, MemCategory::OptimizerState));
    r.v.push_back(r.b->alloc_floats(numel, MemCategory::OptimizerState));
    r.b->fill(r.m.back(), 0.f, numel);
    r.b->fill(r.v.back(), 0.f, numel);
  }
  r.reduce_buf = r.b->alloc_buf(largest, R, MemCategory::Workspace);
  r.f32 = r.b->alloc_floats(largest, MemCategory::Workspace);
  const int stages = int(r.model->stages().size());
  r.first_backward.assign(units.size(), -1);
  for (int pos = 0; pos < stages; ++pos) {
    const int unit = r.model->stages()[stages - 1 - pos].unit;
    if (r.first_backward[unit] < 0) r.first_backward[unit] = pos;
  }
  // 1. The initial weights.
  for (size_t k = 0; k < units.size(); ++k) {
    init_unit_params(*r.b, units[k], int(k), cfg.strategy.seed, r.f32, 0, units[k].numel);
    std::vector<float> init(units[k].numel);
    r.b->download(init.data(), r.f32, init.size() * 4);
    if (init != weights_[k]) fail(0, "unit " + units[k].name + ": initial weights differ from the seeded initialisation");
  }
}

StepCheck::~StepCheck() {
  if (!ref_) return;
  Reference& r = *ref_;
  r.model.reset();
  for (size_t k = 0; k < r.params.size(); ++k)
    for (void* q : {r.params[k].ptr, r.grads[k].ptr, (void*)r.p[k], (void*)r.m[k], (void*)r.v[k]}) r.b->release(q);
  r.b->release(r.reduce_buf.ptr);
  r.b->release(r.f32);
}

std::vector<std::vector<float>> StepCheck::gather_weights() {
  std::vector<std::vector<float>> w;
  for (size_t k = 0; k < run_.model().units().size(); ++k) w.push_back(run_.gather_unit(int(k)));
  // 4. Replicas (and the ranks of a shard group) hold the same weights, bit for bit.
  uint64_t h = fnv1a(w), lo = h, hi = h;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  if (lo != hi) fail(steps_, "the ranks' copies of the weights differ (a replica or shard went its own way)");
  return w;
}

void StepCheck::fail(int step, const std::string& what) {
  if (rank_ == 0 && failure_.empty()) failure_ = "step " + std::to_string(step) + ": " + what;
}

void StepCheck::before_step(int step) { scale_ = run_.loss_scale(); }

void StepCheck::after_step(int step, bool skipped) {
  steps_ = step;
  std::vector<std::vector<float>> grads;
  for (size_t k = 0; k < run_.model().units().size(); ++k) grads.push_back(run_.gather_unit_grad(int(k)));
  std::vector<std::vector<float>> next = gather_weights();
  if (rank_ == 0) {
    check_gradients(step, grads, skipped);
    check_update(step, grads, next, skipped);
  }
  weights_ = std::move(next);
}

// 2. The reduced gradients against the exact sum of the micro-batch gradients.
void StepCheck::check_gradients(int step, const std::vector<std::vector<float>>& grads, bool skipped) {
  Reference& r = *ref_;
  const DType P = cfg_.strategy.param_dtype, R = cfg_.strategy.reduce_dtype;
  const auto& units = r.model->units();
  const auto& stages = r.model->stages();
  const int S = int(stages.size());
  for (size_t k = 0; k < units.size(); ++k) {
    r.b->upload(r.f32, weights_[k].data(), weights_[k].size() * 4);
    r.b->cast(r.params[k], r.f32, units[k].numel);
  }
  std::vector<std::vector<double>> sum(units.size()), abs_sum(units.size());
  for (size_t k = 0; k < units.size(); ++k) {
    sum[k].assign(units[k].numel, 0.0);
    abs_sum[k].assign(units[k].numel, 0.0);
  }
  const float base = float(1.0 / (double(world_) * cfg_.shape.batch * cfg_.shape.dec_len));
  r.model->set_grad_scale(base * scale_);
  bool micro_nonfinite = false;
  std::vector<float> g;
  for (int rank = 0; rank < world_; ++rank) {
    r.model->set_tokens(make_tokens(cfg_.strategy.seed, step, int64_t(rank) * cfg_.shape.batch, cfg_.shape,
                                    cfg_.model.vocab));
    for (int pos = 0; pos < S; ++pos) r.model->forward(pos, r.params[stages[pos].unit]);
    for (int pos = 0; pos < S; ++pos) {
      const int k = stages[S - 1 - pos].unit;
      if (r.first_backward[k] == pos) r.b->fill(r.grads[k], 0.f, units[k].numel);
      r.model->backward(S - 1 - pos, r.params[k], r.grads[k]);
    }
    for (size_t k = 0; k < units.size(); ++k) {
      const int64_t numel = units[k].numel;
      CBuf reduced = r.grads[k];
      if (R != P) {  // the run rounds each rank's gradient into R before reducing
        r.b->cast(r.reduce_buf, r.grads[k], numel);
        reduced = r.reduce_buf;
      }
      r.b->cast(r.f32, reduced, numel);
      g.resize(numel);
      r.b->download(g.data(), r.f32, numel * 4);
      for (int64_t i = 0; i < numel; ++i) {
        micro_nonfinite |= !std::isfinite(g[i]);
        sum[k][i] += g[i];
        abs_sum[k][i] += std::fabs(g[i]);
      }
    }
  }
  // The loss scaler's verdict: overflow is certain when a micro-batch gradient is not finite
  // or an exact sum exceeds R's range; impossible when even Σ|g| (which bounds every
  // partial sum) fits with room for the rounding; either in between.
  const double top = largest_finite(R);
  bool must_skip = micro_nonfinite, may_skip = micro_nonfinite, run_nonfinite = false;
  for (size_t k = 0; k < units.size(); ++k)
    for (size_t i = 0; i < grads[k].size(); ++i) {
      run_nonfinite |= !std::isfinite(grads[k][i]);
      must_skip |= std::fabs(sum[k][i]) > top * (1 + gamma_);
      may_skip |= abs_sum[k][i] * (1 + gamma_) >= top;
    }
  if (skipped != run_nonfinite) fail(step, skipped ? "the update was skipped although the gradients are finite"
                                                   : "the gradients are not finite but the update was not skipped");
  if (skipped && !may_skip) fail(step, "the update was skipped, but the reference's gradients cannot overflow");
  if (!skipped && must_skip) fail(step, "the reference's gradients overflow, but the update was not skipped");
  if (skipped) return;
  const double tol = cfg_.check_tolerance;
  for (size_t k = 0; k < units.size(); ++k)
    for (size_t i = 0; i < grads[k].size(); ++i) {
      // (+ the double sum's own rounding, n·2^-53·Σ|g|, for rigour)
      const double bound = (gamma_ + world_ * std::ldexp(1.0, -53)) * abs_sum[k][i] + eta_;
      const double err = std::fabs(double(grads[k][i]) - sum[k][i]);
      const double ratio = err == 0 ? 0.0 : bound == 0 ? std::numeric_limits<double>::infinity() : err / bound;
      if (!(ratio <= worst_ratio_)) {
        worst_ratio_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
        if (!(ratio <= tol)) {
          char text[256];
          std::snprintf(text, sizeof text,
                        "unit %s element %zu: reduced gradient %.9g, reference %.9g, allowed difference %.3g "
                        "(error %.3g x the rounding bound)",
                        units[k].name.c_str(), i, double(grads[k][i]), sum[k][i], bound * tol, ratio);
          fail(step, text);
        }
      }
      undetermined_ += std::fabs(sum[k][i]) <= bound && sum[k][i] != 0;
      checked_ += 1;
    }
}

// 3. Adam on the run's gradients at the run's weights gives the run's next weights.
void StepCheck::check_update(int step, const std::vector<std::vector<float>>& grads,
                             const std::vector<std::vector<float>>& next, bool skipped) {
  Reference& r = *ref_;
  const auto& units = r.model->units();
  AdamConfig adam = cfg_.strategy.adam;
  adam.grad_unscale = 1.f / scale_;
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
    r.b->adam(r.p[k], r.reduce_buf, r.m[k], r.v[k], numel, adam, step);
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
        std::snprintf(text, sizeof text, "unit %s element %" PRId64 ": weight %.9g after Adam, expected %.9g",
                      units[k].name.c_str(), i, w, e);
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
        "check: %d steps against a single-rank reference (%d micro-batches per step on 1 rank): gradients "
        "within %.3g x their rounding bound (allowed %.3g; %lld of %lld gradients are below their bound, where "
        "Adam's sign is set by rounding), Adam updates within %.3g, replicas identical -> %s\n",
        steps_, world_, worst_ratio_, cfg_.check_tolerance, (long long)undetermined_, (long long)checked_,
        max_update_diff_, ok ? "PASS" : "FAIL");
    if (!ok) std::printf("check: first failure: %s\n", failure_.c_str());
    std::fflush(stdout);
  }
  return ok;
}

}  // namespace sb
