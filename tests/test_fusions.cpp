// The fused operations (ComputeOptions::fused_epilogues: gemm_relu, rmsnorm_forward_residual)
// compute exactly what the operations they stand for compute: the CPU backend's fused forms
// against its composed ones bit for bit in every training precision; a whole T5 step with
// and without them (same loss and gradients bit for bit, fewer recorded operations, the
// same memory plan); and the option plumbing of ComputeOptions.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/core/check.h"
#include "shardbench/core/rng.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"
#include "t5_model.h"

namespace sb {
namespace {

std::vector<float> random(int64_t n, uint64_t key, float shift = 0.f) {
  std::vector<float> v(size_t(n), 0.f);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = uniform_pm1(key, uint64_t(i)) + shift;
  return v;
}

std::unique_ptr<Backend> cpu_with(bool fused) {
  auto b = make_backend("cpu");
  ComputeOptions o;
  o.fused_epilogues = fused;
  b->set_compute_options(o);
  return b;
}

// Counts what a backend records.
struct Count : Recorder {
  int gemms = 0, elementwise = 0, copies = 0;
  void on_op(const OpEvent& e) override {
    gemms += e.kind == OpKind::Gemm;
    elementwise += e.kind == OpKind::Elementwise;
    copies += e.kind == OpKind::Copy;
  }
  void on_memory(double, const MemBytes&) override {}
};

const DType kTypes[] = {DType::F32, DType::BF16, DType::F16};

TEST(Fusions, GemmReluEqualsGemmThenRelu) {
  const int M = 37, N = 29, K = 45;
  for (DType t : kTypes)
    for (float beta : {0.f, 0.5f})
      for (int trans = 0; trans < 4; ++trans) {
        const bool ta = trans & 1, tb = trans & 2;
        std::vector<float> out[2];
        int ops[2] = {0, 0};
        for (bool fused : {false, true}) {
          auto b = cpu_with(fused);
          Count count;
          const Buf A = upload_as(*b, random(int64_t(M) * K, 1), t), B = upload_as(*b, random(int64_t(K) * N, 2), t);
          const Buf C = upload_as(*b, random(int64_t(M) * N, 3), t);
          b->set_recorder(&count);
          b->gemm_relu(ta, tb, M, N, K, 0.75f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
          b->set_recorder(nullptr);
          out[fused] = download_f32(*b, C, int64_t(M) * N);
          ops[fused] = count.gemms + count.elementwise;
          for (const Buf& x : {A, B, C}) b->release(x.ptr);
        }
        const std::string what = std::string(dtype_name(t)) + " beta " + std::to_string(beta) + " trans " +
                                 std::to_string(trans);
        EXPECT_EQ(out[1], out[0]) << what;
        EXPECT_EQ(ops[0], 2) << what << ": composed, a GEMM and a ReLU";
        EXPECT_EQ(ops[1], 1) << what << ": fused, one GEMM";
        int zeros = 0, positive = 0;
        for (float x : out[1]) zeros += x == 0.f, positive += x > 0.f;
        EXPECT_GT(zeros, 0) << what;  // the ReLU has something to do
        EXPECT_GT(positive, 0) << what;
      }
}

TEST(Fusions, RmsNormResidualEqualsRmsNormThenCopy) {
  const int n = 23, d = 70;
  for (DType t : kTypes) {
    std::vector<float> out[2], res[2], rstd[2];
    int ops[2] = {0, 0};
    for (bool fused : {false, true}) {
      auto b = cpu_with(fused);
      Count count;
      const Buf x = upload_as(*b, random(int64_t(n) * d, 4, 0.3f), t), w = upload_as(*b, random(d, 5, 1.f), t);
      const Buf o = b->alloc_buf(int64_t(n) * d, t, MemCategory::Workspace);
      const Buf r = b->alloc_buf(int64_t(n) * d, t, MemCategory::Workspace);
      float* s = b->alloc_floats(n, MemCategory::Workspace);
      b->set_recorder(&count);
      b->rmsnorm_forward_residual(o, s, r, x, w, n, d, 1e-6f);
      b->set_recorder(nullptr);
      out[fused] = download_f32(*b, o, int64_t(n) * d);
      res[fused] = download_f32(*b, r, int64_t(n) * d);
      rstd[fused] = download_f32(*b, s, n);
      EXPECT_EQ(res[fused], download_f32(*b, x, int64_t(n) * d)) << dtype_name(t) << " fused " << fused;
      ops[fused] = count.elementwise + count.copies;
      for (void* p : {x.ptr, w.ptr, o.ptr, r.ptr, static_cast<void*>(s)}) b->release(p);
    }
    EXPECT_EQ(out[1], out[0]) << dtype_name(t);
    EXPECT_EQ(rstd[1], rstd[0]) << dtype_name(t);
    EXPECT_EQ(ops[0], 2) << dtype_name(t) << ": composed, a norm and a copy";
    EXPECT_EQ(ops[1], 1) << dtype_name(t) << ": fused, one pass";
  }
}

// One forward and backward of a T5 step; returns the loss sum and every unit's gradient.
struct StepResult {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  Count count;
};
StepResult run_step(Backend& b, const ModelSpec& spec, const StepShape& x, bool ckpt, DType t, AttentionImpl a) {
  StepResult r;
  T5Model m(b, spec, x, ckpt, t, 1.f, a);
  b.set_recorder(&r.count);
  const auto& st = m.step->pieces();
  for (size_t i = 0; i < st.size(); ++i) m.step->forward(int(i), by_unit(m.params));
  const auto& units = m.step->units();
  for (size_t u = 0; u < units.size(); ++u) b.fill(m.grads[u], 0.f, units[u].numel);
  for (int i = int(st.size()) - 1; i >= 0; --i) m.step->backward(i, by_unit(m.params), by_unit(m.grads));
  b.set_recorder(nullptr);
  r.loss = m.step->loss_sum();
  for (size_t u = 0; u < units.size(); ++u) r.grads.push_back(download_f32(b, m.grads[u], units[u].numel));
  return r;
}

// The model calls the fused forms at every site: with them on, a step gives the same bits
// and records one operation less per fused site (per block: the self-attention norm's copy,
// the FFN norm's copy and the FFN ReLU; the decoder's cross-attention norm's copy too).
TEST(Fusions, T5StepIsBitIdenticalWithFewerOperations) {
  const ModelSpec spec = model_preset("t5-tiny");
  const StepShape x{2, 9, 7};
  for (DType t : kTypes)
    for (AttentionImpl a : {AttentionImpl::Unfused, AttentionImpl::Fused})
      for (bool ckpt : {false, true}) {
        auto plain = cpu_with(false), fused = cpu_with(true);
        const StepResult r0 = run_step(*plain, spec, x, ckpt, t, a), r1 = run_step(*fused, spec, x, ckpt, t, a);
        const std::string what = std::string(dtype_name(t)) + " " + attention_impl_name(a) + " ckpt " +
                                 std::to_string(ckpt);
        EXPECT_EQ(r1.loss, r0.loss) << what;
        EXPECT_EQ(r1.grads, r0.grads) << what;
        const int L = int(spec.layers), passes = ckpt ? 2 : 1;  // checkpointing runs each block's forward twice
        const int sites = passes * (3 * L + 4 * L);
        const int ops0 = r0.count.gemms + r0.count.elementwise + r0.count.copies;
        const int ops1 = r1.count.gemms + r1.count.elementwise + r1.count.copies;
        EXPECT_EQ(ops0 - ops1, sites) << what;
        EXPECT_EQ(r1.count.gemms, r0.count.gemms) << what;
      }
}

// No fused form allocates: the plan (counting backend) is the same, and equals the CPU's
// peak with the fusions on.
TEST(Fusions, PlanIsUnchangedAndExact) {
  const ModelSpec spec = model_preset("t5-tiny");
  const StepShape x{2, 9, 7};
  for (AttentionImpl a : {AttentionImpl::Unfused, AttentionImpl::Fused}) {
    auto fused = cpu_with(true), plain = cpu_with(false);
    auto counting = make_counting_backend();
    for (Backend* b : {fused.get(), plain.get(), counting.get()}) run_step(*b, spec, x, false, DType::BF16, a);
    EXPECT_EQ(fused->mem_peak(), counting->mem_peak()) << attention_impl_name(a);
    EXPECT_EQ(plain->mem_peak(), counting->mem_peak()) << attention_impl_name(a);
  }
}

TEST(Fusions, AttentionKernelNamesRoundTrip) {
  for (AttentionKernel k : {AttentionKernel::Auto, AttentionKernel::Fma, AttentionKernel::Mma})
    EXPECT_EQ(parse_attention_kernel(attention_kernel_name(k), "--attention-kernel"), k);
  try {
    parse_attention_kernel("wgmma", "--attention-kernel");
    FAIL() << "wgmma accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--attention-kernel 'wgmma' is not allowed (allowed: auto, fma, mma)");
  }
}

}  // namespace
}  // namespace sb
