// CPU backend kernels against naive references (the fused attention op against a
// double-precision one), and memory accounting.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attention_expect.h"
#include "shardbench/backend/backend.h"
#include "shardbench/core/half.h"
#include "../src/backend/pointer_map.h"

using namespace sb;

TEST(CpuBackend, GemmAllTransposes) {
  auto b = make_backend("cpu");
  const int M = 5, N = 4, K = 3;
  std::vector<float> A(M * K), B(K * N);
  for (int i = 0; i < M * K; ++i) A[i] = float(i % 7) - 3;
  for (int i = 0; i < K * N; ++i) B[i] = float(i % 5) - 2;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Store op(A) = A: when transposed, the stored matrix is A^T.
      std::vector<float> As(M * K), Bs(K * N), C(M * N, 1.f);
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) As[ta ? k * M + i : i * K + k] = A[i * K + k];
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j) Bs[tb ? j * K + k : k * N + j] = B[k * N + j];
      b->gemm(ta, tb, M, N, K, 2.f, As.data(), ta ? M : K, Bs.data(), tb ? K : N, 1.f, C.data(), N);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          float ref = 1.f;
          for (int k = 0; k < K; ++k) ref += 2.f * A[i * K + k] * B[k * N + j];
          EXPECT_FLOAT_EQ(C[i * N + j], ref) << ta << tb << i << j;
        }
    }
}

TEST(CpuBackend, SoftmaxCausalAndBackward) {
  auto b = make_backend("cpu");
  const int T = 3;
  std::vector<float> s = {1, 2, 3, 4, 5, 6, 7, 8, 9}, bias(9, 0.5f);
  b->softmax_forward(s.data(), bias.data(), true, 1, 1, T, T);
  EXPECT_FLOAT_EQ(s[0], 1.f);
  EXPECT_FLOAT_EQ(s[1], 0.f);
  EXPECT_NEAR(s[3], 1.f / (1.f + std::exp(1.f)), 1e-6);
  EXPECT_NEAR(s[6] + s[7] + s[8], 1.f, 1e-6);
  // Σ_j dS = 0 for every row (softmax is shift invariant).
  std::vector<float> d = {1, -1, 2, 0.5f, 3, -2, 1, 1, 1}, dbias(9, 0.f);
  b->softmax_backward(d.data(), s.data(), dbias.data(), 1, 1, T, T);
  for (int i = 0; i < T; ++i) EXPECT_NEAR(d[3 * i] + d[3 * i + 1] + d[3 * i + 2], 0.f, 1e-6);
  EXPECT_FLOAT_EQ(dbias[4], d[4]);
}

TEST(CpuBackend, CrossEntropyLossAndGradient) {
  auto b = make_backend("cpu");
  std::vector<float> logits = {0, 0, 0, 0, 1, 2, 3, 4};
  std::vector<int> labels = {2, 3};
  std::vector<float> loss(2);
  b->cross_entropy(logits.data(), loss.data(), labels.data(), 2, 4, 0.5f);
  EXPECT_NEAR(loss[0], std::log(4.f), 1e-6);
  EXPECT_NEAR(logits[2], 0.5f * (0.25f - 1.f), 1e-6);
  float row = 0;
  for (int j = 4; j < 8; ++j) row += logits[j];
  EXPECT_NEAR(row, 0.f, 1e-6);
}

TEST(CpuBackend, AdamFirstStepMovesByLr) {
  auto b = make_backend("cpu");
  std::vector<float> p = {1, 1, 1}, g = {0.5f, -2.f, 0.f}, state(6, 0.f);  // m, v
  OptimizerConfig c;
  c.lr = 0.1f;
  b->optimizer_update(c, 1, p.data(), g.data(), state.data(), 3);
  EXPECT_NEAR(p[0], 0.9f, 1e-5);  // bias-corrected first step: lr · sign(g)
  EXPECT_NEAR(p[1], 1.1f, 1e-5);
  EXPECT_FLOAT_EQ(p[2], 1.f);
}

TEST(CpuBackend, RmsNormForward) {
  auto b = make_backend("cpu");
  std::vector<float> x = {3, 4}, w = {1, 2}, out(2), rstd(1);
  b->rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, 2, 0.f);
  const float r = 1.f / std::sqrt(12.5f);
  EXPECT_NEAR(out[0], 3 * r, 1e-6);
  EXPECT_NEAR(out[1], 8 * r, 1e-6);
}

TEST(Backend, MemoryAccountingByCategory) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_backend("cpu"));
  backends.push_back(make_counting_backend());
  for (auto& b : backends) {
    float* p = b->alloc_floats(100, MemCategory::Parameters);
    float* a = b->alloc_floats(50, MemCategory::Activations);
    EXPECT_EQ(b->mem_current()[int(MemCategory::Parameters)], 400);
    EXPECT_EQ(b->mem_total_current(), 600);
    b->release(a);
    float* w = b->alloc_floats(10, MemCategory::Workspace);
    EXPECT_EQ(b->mem_peak()[int(MemCategory::Activations)], 200);
    EXPECT_EQ(b->mem_peak_total(), 600);
    EXPECT_EQ(b->mem_total_current(), 440);
    b->release(w);
    b->release(p);
    EXPECT_EQ(b->mem_total_current(), 0);
  }
}

TEST(Backend, UnknownBackendIsAUsageError) {
  EXPECT_ANY_THROW(make_backend("tpu"));
}

// Host bfloat16/half conversions: round to nearest even, the edges of the ranges.
TEST(Half, ConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f808000u)), 0x3f80);  // tie → even
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f818000u)), 0x3f82);  // tie → even (up)
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  EXPECT_EQ(float_to_f16_bits(1.f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.f), 0xc000);
  EXPECT_EQ(float_to_f16_bits(65504.f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(65520.f), 0x7c00);               // rounds up to infinity
  EXPECT_EQ(float_to_f16_bits(1.f / 3), 0x3555);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.f, -25)), 0x0000);  // tie → even (zero)
  EXPECT_EQ(float_to_f16_bits(std::ldexp(3.f, -25)), 0x0002);  // tie → even (up)
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite half survives the round trip
    ASSERT_EQ(float_to_f16_bits(f16_bits_to_float(uint16_t(h))), h) << h;
  for (uint32_t h = 0; h < 0x7f80; h += 7)
    ASSERT_EQ(float_to_bf16_bits(bf16_bits_to_float(uint16_t(h))), h) << h;
}

// The CPU backend on bf16/fp16 tensors: loads, computes in fp32, stores rounded once.
TEST(CpuBackend, LowPrecisionOpsRoundOnceFromFp32) {
  auto b = make_backend("cpu");
  const int M = 6, N = 5, K = 7;
  std::vector<float> A(M * K), B(N * K), C(M * N, 0.25f);
  for (int i = 0; i < M * K; ++i) A[i] = std::sin(0.7f * i);
  for (int i = 0; i < N * K; ++i) B[i] = std::cos(0.3f * i);
  for (DType t : {DType::BF16, DType::F16}) {
    auto round = [&](float x) { return t == DType::BF16 ? float(bf16(x)) : float(f16(x)); };
    std::vector<uint16_t> a(A.size()), bb(B.size()), c(C.size());
    Buf ab{a.data(), t}, bbuf{bb.data(), t}, cb{c.data(), t};
    b->cast(ab, A.data(), M * K);
    b->cast(bbuf, B.data(), N * K);
    b->cast(cb, C.data(), M * N);
    b->gemm(false, true, M, N, K, 1.5f, ab, K, bbuf, K, 1.f, cb, N);  // C = 1.5 A B^T + C
    std::vector<float> got(C.size());
    b->cast(got.data(), cb, M * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float ref = round(0.25f);
        for (int k = 0; k < K; ++k) ref += 1.5f * round(A[i * K + k]) * round(B[j * K + k]);
        EXPECT_EQ(got[i * N + j], round(ref)) << dtype_name(t) << " " << i << "," << j;
      }
    // beta = 0 into a C with ldc > N: the columns past N are not the GEMM's and stay as they were.
    std::vector<float> wide(M * (N + 3), 7.f);
    std::vector<uint16_t> w(wide.size());
    b->cast(Buf{w.data(), t}, wide.data(), int64_t(wide.size()));
    b->gemm(false, true, M, N, K, 1.f, ab, K, bbuf, K, 0.f, Buf{w.data(), t}, N + 3);
    b->cast(wide.data(), CBuf{w.data(), t}, int64_t(wide.size()));
    for (int i = 0; i < M; ++i)
      for (int j = N; j < N + 3; ++j) EXPECT_EQ(wide[i * (N + 3) + j], 7.f) << dtype_name(t) << " gap " << i << "," << j;
    // An in-place elementwise op on a 16-bit tensor equals the fp32 op, rounded.
    std::vector<float> x = {-1.5f, 0.3f, 2.7f, -0.1f};
    std::vector<uint16_t> xs(x.size());
    b->cast(Buf{xs.data(), t}, x.data(), 4);
    b->relu_forward(Buf{xs.data(), t}, 4);
    b->scale(Buf{xs.data(), t}, 3.f, 4);
    std::vector<float> back(4);
    b->cast(back.data(), CBuf{xs.data(), t}, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], round(std::max(0.f, round(x[i])) * 3.f)) << i;
  }
}

// The CPU backend's vectorised casts (F16C where the build has it) give the scalar
// conversions' values, including ties, subnormals and overflow.
TEST(CpuBackend, CastsAgreeWithTheScalarConversions) {
  auto b = make_backend("cpu");
  std::vector<float> x;
  for (uint32_t u = 0; u < 0xffffffffu - 99991; u += 99991) x.push_back(bits_float(u));  // every exponent
  for (uint32_t h = 0; h < 0x10000; ++h) x.push_back(f16_bits_to_float(uint16_t(h)) * 1.0004883f);  // near ties
  x.erase(std::remove_if(x.begin(), x.end(), [](float v) { return std::isnan(v); }), x.end());
  const int64_t n = int64_t(x.size());
  for (DType t : {DType::F16, DType::BF16}) {
    std::vector<uint16_t> got(x.size());
    b->cast(Buf{got.data(), t}, x.data(), n);
    std::vector<float> back(x.size());
    b->cast(back.data(), CBuf{got.data(), t}, n);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = t == DType::F16 ? float_to_f16_bits(x[i]) : float_to_bf16_bits(x[i]);
      ASSERT_EQ(got[i], want) << dtype_name(t) << " of " << x[i];
      const float want_back = t == DType::F16 ? f16_bits_to_float(want) : bf16_bits_to_float(want);
      ASSERT_EQ(float_bits(back[i]), float_bits(want_back)) << dtype_name(t) << " of " << x[i];
    }
  }
}

// ---- gated GELU (T5 v1.1's feed-forward gate) against a double-precision reference ----
// Hugging Face's "gelu_new": g(x) = x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2.
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
// Its derivative by the chain rule, checked below against central differences of g.
double gelu_tanh_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// h = g(u) v; du = dh v g'(u), dv = dh g(u), with du written over dh (as the model does).
// fp32: within 2e-6 of the double reference (normwise, measured: printed); bf16 and fp16:
// the fp32 result on the rounded inputs, rounded once (one ulp at most: tanh differs from
// the double one in the last fp32 bit).
TEST(CpuBackend, GatedGeluMatchesDoubleReference) {
  double max_fd = 0;
  for (double x = -6; x <= 6; x += 0.01) {  // the analytic derivative against central differences
    const double h = 1e-5, fd = (gelu_tanh_ref(x + h) - gelu_tanh_ref(x - h)) / (2 * h);
    max_fd = std::max(max_fd, std::abs(fd - gelu_tanh_grad_ref(x)));
  }
  EXPECT_LT(max_fd, 1e-8);
  auto b = make_backend("cpu");
  const int64_t n = 4099;
  std::vector<float> u(n), v(n), dh(n);
  for (int64_t i = 0; i < n; ++i) {  // u over the whole curve, both tails included
    u[i] = float(-8.0 + 16.0 * double(i) / double(n - 1));
    v[i] = std::sin(0.37f * float(i)) * 2.f;
    dh[i] = std::cos(0.11f * float(i)) * 1.5f;
  }
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    auto round = [&](double x) {
      return t == DType::BF16 ? double(float(bf16(float(x)))) : t == DType::F16 ? double(float(f16(float(x)))) : x;
    };
    std::vector<uint32_t> su(n), sv(n), sdh(n), sh(n), sdv(n);  // room for any of the three types
    const Buf bu{su.data(), t}, bv{sv.data(), t}, bdh{sdh.data(), t}, bh{sh.data(), t}, bdv{sdv.data(), t};
    b->cast(bu, u.data(), n);
    b->cast(bv, v.data(), n);
    b->cast(bdh, dh.data(), n);
    b->gated_gelu_forward(bh, bu, bv, n);
    b->gated_gelu_backward(bdh, bdv, bdh, bu, bv, n);  // du in dh's place
    std::vector<float> h(n), du(n), dv(n);
    b->cast(h.data(), CBuf(bh), n);
    b->cast(du.data(), CBuf(bdh), n);
    b->cast(dv.data(), CBuf(bdv), n);
    std::vector<double> ref[3];
    double err[3] = {0, 0, 0}, scale[3] = {0, 0, 0};
    for (int64_t i = 0; i < n; ++i) {
      const double ui = round(u[i]), vi = round(v[i]), di = round(dh[i]);
      ref[0].push_back(gelu_tanh_ref(ui) * vi);
      ref[1].push_back(di * vi * gelu_tanh_grad_ref(ui));
      ref[2].push_back(di * gelu_tanh_ref(ui));
      for (int k = 0; k < 3; ++k) scale[k] = std::max(scale[k], std::abs(ref[k].back()));
    }
    for (int64_t i = 0; i < n; ++i) {
      const float got[3] = {h[i], du[i], dv[i]};
      for (int k = 0; k < 3; ++k) {
        const double r = ref[k][size_t(i)], e = std::abs(got[k] - r);
        // 16-bit: one rounding of an fp32 value that is within 2e-6 (normwise) of r
        if (t != DType::F32) {
          ASSERT_LE(e, std::abs(r) * (t == DType::BF16 ? 1.0 / 256 : 1.0 / 2048) + 2e-6 * scale[k])
              << dtype_name(t) << " output " << k << " at u " << round(u[i]);
        }
        err[k] = std::max(err[k], e);
      }
    }
    if (t == DType::F32) {
      for (int k = 0; k < 3; ++k) EXPECT_LT(err[k] / scale[k], 2e-6) << "output " << k;
      std::printf("gated GELU fp32 against double: normwise error h %.2g, du %.2g, dv %.2g\n", err[0] / scale[0],
                  err[1] / scale[1], err[2] / scale[2]);
    }
  }
  // The counting backend records the bytes the CUDA kernels move: 3 and 5 arrays.
  auto c = make_counting_backend();
  struct Bytes : Recorder {
    std::vector<int64_t> seen;
    void on_op(const OpEvent& e) override { seen.push_back(e.bytes); }
    void on_memory(double, const MemBytes&) override {}
  } rec;
  c->set_recorder(&rec);
  const Buf x = c->alloc_buf(10, DType::BF16, MemCategory::Workspace);
  c->gated_gelu_forward(x, x, x, 10);
  c->gated_gelu_backward(x, x, x, x, x, 10);
  EXPECT_EQ(rec.seen, (std::vector<int64_t>{60, 100}));
  c->release(x.ptr);
}

// The inf/NaN check of dynamic loss scaling, in every training precision.
TEST(CpuBackend, AllFiniteFindsInfAndNan) {
  auto b = make_backend("cpu");
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<float> x(1000, 0.5f);
    std::vector<uint32_t> store(x.size());  // room for any of the three types
    const Buf buf{store.data(), t};
    b->cast(buf, x.data(), int64_t(x.size()));
    EXPECT_TRUE(b->all_finite(buf, int64_t(x.size()))) << dtype_name(t);
    for (float bad : {INFINITY, -INFINITY, NAN, 1e6f}) {  // 1e6 overflows fp16 to inf
      x[737] = bad;
      b->cast(buf, x.data(), int64_t(x.size()));
      const bool finite_in_t = !(std::isinf(bad) || std::isnan(bad)) && !(t == DType::F16 && bad > 65504.f);
      EXPECT_EQ(b->all_finite(buf, int64_t(x.size())), finite_in_t) << dtype_name(t) << " " << bad;
      EXPECT_TRUE(b->all_finite(buf, 737)) << "only the first 737 elements";
    }
  }
}

// ---- fused attention (flash-attention style) against a double-precision reference ----
// Shapes cover the model's three uses: encoder self-attention (bidirectional bias, no
// mask), decoder self-attention (causal bias and mask) and cross-attention (no bias,
// tq != tk); lengths 1 to 130 hit partial tiles (the CPU's tiles are 64 rows/keys) and
// several key chunks; and the degenerate shapes: one key (P = 1, so dq and dk are a
// cancellation, zero up to rounding), one query, one head, and the GPU's d_kv 128.
// Each output must be within its rounding bound (AttnTolerance, attention_problem.h):
// fp32 arithmetic relative to the magnitudes the output sums (so a cancellation is judged
// by the rounding it carries, not relative to its own near-zero value) plus, in bf16, one
// rounding of the stored output relative to its value; and where it is not a cancellation
// the test checks it could fail (a zero output would be more than twice the bound).
struct AttnCase {
  const char* what;
  int tq, tk;
  bool causal, bias;
  int heads = 3, d_kv = 12;
};
const AttnCase kAttnCases[] = {
    {"encoder self", 5, 5, false, true},     {"encoder self", 64, 64, false, true},
    {"encoder self", 130, 130, false, true}, {"decoder self", 1, 1, true, true},
    {"decoder self", 70, 70, true, true},    {"decoder self", 129, 129, true, true},
    {"cross", 70, 130, false, false},        {"cross", 3, 65, false, false},
    {"causal, tq < tk", 20, 90, true, true},
    // degenerate: one key, one query, one head, and the GPU's failing shape (d_kv 128)
    {"one key", 70, 1, false, true},         {"one key, causal", 40, 1, true, true},
    {"one key, cross", 66, 1, false, false}, {"one query", 1, 70, false, true},
    {"one query, causal", 1, 70, true, true}, {"one head", 70, 70, true, true, 1},
    {"one of each", 1, 1, false, true, 1},   {"decoder self d128", 1, 1, true, true, 3, 128},
    {"decoder self d128", 97, 97, true, true, 2, 128},
};

TEST(CpuBackend, FusedAttentionMatchesReference) {
  auto b = make_backend("cpu");
  for (DType t : {DType::F32, DType::BF16})
    for (const AttnCase& c : kAttnCases) {
      const AttentionShape s{2, c.heads, c.tq, c.tk, c.d_kv, 16, c.causal};
      AttnProblem p(s, c.bias, 100 + c.tq);
      p.round_to(t);
      AttnResult scale;
      const AttnResult ref = p.reference(&scale), got = p.run(*b, t);
      const std::string what = std::string(c.what) + " tq " + std::to_string(c.tq) + " tk " + std::to_string(c.tk) +
                               " heads " + std::to_string(c.heads) + " d_kv " + std::to_string(c.d_kv) + " " +
                               dtype_name(t);
      const double worst =
          expect_attention_within(got, ref, scale, AttnTolerance::of(t, false), one_visible_key(s), what);
      std::printf("fused attention %-40s worst error / bound %.3f\n", what.c_str(), worst);
    }
}

// The bias-table gradient is reduced in a fixed order: two runs agree bitwise, and the
// result does not depend on what the workspace held before (run() fills it with NaN).
TEST(CpuBackend, FusedAttentionIsDeterministic) {
  auto b = make_backend("cpu");
  AttnProblem p(AttentionShape{2, 2, 100, 100, 8, 16, true}, true, 7);
  const AttnResult r1 = p.run(*b, DType::F32), r2 = p.run(*b, DType::F32);
  EXPECT_EQ(r1.dtable, r2.dtable);
  EXPECT_EQ(r1.dq, r2.dq);
  EXPECT_EQ(r1.dk, r2.dk);
}

// The fused op is recorded as the GEMMs it replaces and its workspace is small: no
// [batch, heads, tq, tk] buffer.
TEST(Backend, FusedAttentionAccounting) {
  const AttentionShape s{8, 16, 512, 512, 64, 32, false};
  EXPECT_EQ(attention_flops(s, false), 4.0 * 8 * 16 * 512 * 512 * 64);
  EXPECT_EQ(attention_flops(s, true), 2 * attention_flops(s, false));
  const auto g = attention_gemm_shape(s, true);
  EXPECT_EQ(2.0 * g[0] * g[1] * g[2] * g[3], attention_flops(s, true));
  EXPECT_EQ(attention_workspace_floats(s, false), 8 * 16 * 512);
  EXPECT_LT(attention_workspace_floats(s, true), int64_t(8) * 16 * 512 * 512 / 32);
}

// ---- host offload: the host ledger, copy_async, host_compute ----

namespace {
// The CPU backend's collectives need MPI: a singleton world where the binary runs alone.
void ensure_mpi() {
  int up = 0;
  MPI_Initialized(&up);
  if (up) return;
  MPI_Init(nullptr, nullptr);
  std::atexit([] {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  });
}

struct Collect : Recorder {
  std::vector<OpEvent> ops;
  std::vector<MemBytes> device, host;
  void on_op(const OpEvent& e) override { ops.push_back(e); }
  void on_memory(double, const MemBytes& m) override { device.push_back(m); }
  void on_host_memory(double, const MemBytes& m) override { host.push_back(m); }
  std::vector<OpEvent> on_lane(int lane) const {
    std::vector<OpEvent> v;
    for (const OpEvent& e : ops)
      if (e.lane == lane) v.push_back(e);
    return v;
  }
};
}  // namespace

TEST(Backend, HostLedgerCountsAndPeaksApartFromTheDevice) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_backend("cpu"));
  backends.push_back(make_counting_backend());
  for (auto& b : backends) {
    Collect rec;
    b->set_recorder(&rec);
    float* d = b->alloc_floats(10, MemCategory::Parameters);
    float* p = b->alloc_host_floats(100, MemCategory::Parameters);
    float* m = b->alloc_host_floats(200, MemCategory::OptimizerState);
    EXPECT_EQ(b->host_mem_current()[int(MemCategory::Parameters)], 400) << b->name();
    EXPECT_EQ(b->host_mem_current()[int(MemCategory::OptimizerState)], 800);
    EXPECT_EQ(b->host_mem_total_current(), 1200);
    EXPECT_EQ(b->mem_total_current(), 40);  // the device ledger holds only its own
    b->release_host(m);
    float* g = b->alloc_host_floats(50, MemCategory::Gradients);
    EXPECT_EQ(b->host_mem_peak()[int(MemCategory::OptimizerState)], 800);
    EXPECT_EQ(b->host_mem_peak_total(), 1200);
    EXPECT_EQ(b->host_mem_total_current(), 600);
    EXPECT_EQ(b->mem_peak_total(), 40);
    b->reset_peaks();
    EXPECT_EQ(b->host_mem_peak_total(), 600);
    EXPECT_EQ(b->host_mem_peak()[int(MemCategory::OptimizerState)], 0);
    b->release_host(g);
    b->release_host(p);
    b->release(d);
    EXPECT_EQ(b->host_mem_total_current(), 0);
    // Every change reported to its own callback: 6 host changes, 2 device changes.
    ASSERT_EQ(rec.host.size(), 6u);
    EXPECT_EQ(rec.host[1][int(MemCategory::OptimizerState)], 800);
    EXPECT_EQ(rec.device.size(), 2u);
    b->set_recorder(nullptr);
  }
}

TEST(CpuBackend, CopyAsyncRoundTripOnTheCopyLanes) {
  auto b = make_backend("cpu");
  Collect rec;
  b->set_recorder(&rec);
  const int n = 1000;
  float* host = b->alloc_host_floats(n, MemCategory::Parameters);
  float* dev = b->alloc_floats(n, MemCategory::CommBuffers);
  for (int i = 0; i < n; ++i) host[i] = float(i);
  const Request up = b->copy_async(dev, host, n * 4, CopyDirection::HostToDevice);
  b->wait(up);
  b->scale(dev, 2.f, n);  // compute on the device copy
  float* back = b->alloc_host_floats(n, MemCategory::Gradients);
  const Request down = b->copy_async(back, dev, n * 4, CopyDirection::DeviceToHost);
  EXPECT_TRUE(b->test(down));
  b->wait(down);
  for (int i = 0; i < n; ++i) ASSERT_EQ(back[i], 2.f * i);
  const auto h2d = rec.on_lane(kCopyH2DLane), d2h = rec.on_lane(kCopyD2HLane);
  ASSERT_EQ(h2d.size(), 1u);
  ASSERT_EQ(d2h.size(), 1u);
  EXPECT_EQ(h2d[0].kind, OpKind::Copy);
  EXPECT_EQ(h2d[0].bytes, n * 4);
  EXPECT_EQ(h2d[0].request, up);
  EXPECT_EQ(d2h[0].request, down);
  EXPECT_NE(up, down);
  EXPECT_GE(d2h[0].start, h2d[0].end);
  for (const OpEvent& e : rec.ops) EXPECT_NE(e.kind == OpKind::Copy && e.lane == 0, true);  // off the compute lane
  b->release(dev);
  b->release_host(back);
  b->release_host(host);
  b->set_recorder(nullptr);
}

// A copy stream-ordered after a collective still in flight waits for it (the reduced
// values are what it copies); a collective ordered after that copy starts after it; the
// host update waits for the copy, and its own event is on the host lane.
TEST(CpuBackend, CopiesAndCollectivesOrderedAfterEachOther) {
  ensure_mpi();
  auto b = make_backend("cpu");
  auto world = b->make_comm(MPI_COMM_WORLD);
  const int ranks = world->size(), n = 256;
  Collect rec;
  b->set_recorder(&rec);
  float* grad = b->alloc_floats(n, MemCategory::Gradients);
  b->fill(grad, 1.f, n);
  float* host = b->alloc_host_floats(n, MemCategory::Gradients);
  std::fill(host, host + n, -1.f);
  const Request reduce = b->all_reduce(grad, n, *world);  // sum: `ranks` everywhere
  const Request down = b->copy_async(host, grad, n * 4, CopyDirection::DeviceToHost, reduce);
  float* gathered = b->alloc_floats(int64_t(n) * ranks, MemCategory::CommBuffers);
  CollectiveArgs ag{Collective::AllGather, grad, gathered, n, DType::F32, ReduceOp::Sum, 0};
  ag.after = down;
  const Request gather = b->collective(ag, *world);
  bool ran = false;
  b->host_compute([&] {
    ran = true;
    for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], float(ranks));  // the copy has run, after the reduction
  }, n * 4, {down});
  EXPECT_TRUE(ran);
  b->wait(gather);
  std::vector<float> g(size_t(n) * ranks);
  b->download(g.data(), gathered, g.size() * 4);
  for (float v : g) ASSERT_EQ(v, float(ranks));
  auto find = [&](OpKind k, Request r) {
    for (const OpEvent& e : rec.ops)
      if (e.kind == k && e.request == r) return e;
    ADD_FAILURE() << op_kind_name(k) << " " << r << " not recorded";
    return OpEvent{};
  };
  const OpEvent r = find(OpKind::AllReduce, reduce), c = find(OpKind::Copy, down), a = find(OpKind::AllGather, gather);
  EXPECT_EQ(c.lane, kCopyD2HLane);
  EXPECT_EQ(c.after, reduce);
  EXPECT_GE(c.start, r.end);
  EXPECT_GE(a.start, c.end);
  const auto host_ops = rec.on_lane(kHostLane);
  ASSERT_EQ(host_ops.size(), 1u);
  EXPECT_EQ(host_ops[0].kind, OpKind::Optimizer);
  EXPECT_EQ(host_ops[0].bytes, n * 4);
  EXPECT_GE(host_ops[0].start, c.end);
  b->release(gathered);
  b->release_host(host);
  b->release(grad);
  b->set_recorder(nullptr);
}

// release_after on a copy deferred behind a collective: counted free at once, freed when
// the copy has run (the sanitizer-free check: no crash, the ledger at zero).
TEST(CpuBackend, ReleaseAfterADeferredCopy) {
  ensure_mpi();
  auto b = make_backend("cpu");
  auto world = b->make_comm(MPI_COMM_WORLD);
  const int n = 64;
  float* dev = b->alloc_floats(n, MemCategory::Gradients);
  b->fill(dev, 3.f, n);
  float* host = b->alloc_host_floats(n, MemCategory::Gradients);
  const Request reduce = b->all_reduce(dev, n, *world);
  const Request down = b->copy_async(host, dev, n * 4, CopyDirection::DeviceToHost, reduce);
  b->release_after(dev, down);
  EXPECT_EQ(b->mem_total_current(), 0);
  b->wait(down);
  EXPECT_EQ(host[0], 3.f * world->size());
  b->release_host(host);
}

TEST(CountingBackend, CopiesAndHostComputeInTheSchedule) {
  auto b = make_counting_backend();
  Collect rec;
  b->set_recorder(&rec);
  void* host = b->alloc_host(1 << 20, MemCategory::OptimizerState);
  void* dev = b->alloc(1 << 10, MemCategory::Parameters);
  auto comm = make_planned_comm(4, 0);
  const Request rs = b->reduce_scatter(Buf(static_cast<float*>(dev)), Buf(static_cast<float*>(dev)), 64, *comm);
  const Request down = b->copy_async(host, dev, 256, CopyDirection::DeviceToHost, rs);
  bool ran = false;
  b->host_compute([&] { ran = true; }, 4096, {down});
  const Request up = b->copy_async(dev, host, 256, CopyDirection::HostToDevice);
  b->wait(up);
  EXPECT_FALSE(ran);  // recorded, not run: the host buffers point nowhere
  EXPECT_EQ(b->host_mem_peak_total(), 1 << 20);
  EXPECT_EQ(b->mem_peak_total(), 1 << 10);
  ASSERT_EQ(rec.ops.size(), 6u);  // reduce-scatter, copy, host wait, optimizer, copy, wait
  EXPECT_EQ(rec.ops[1].kind, OpKind::Copy);
  EXPECT_EQ(rec.ops[1].lane, kCopyD2HLane);
  EXPECT_EQ(rec.ops[1].after, rs);
  EXPECT_EQ(rec.ops[1].request, down);
  EXPECT_EQ(rec.ops[1].bytes, 256);
  EXPECT_EQ(rec.ops[2].kind, OpKind::Wait);
  EXPECT_EQ(rec.ops[2].lane, kHostLane);
  EXPECT_EQ(rec.ops[2].request, down);
  EXPECT_EQ(rec.ops[3].kind, OpKind::Optimizer);
  EXPECT_EQ(rec.ops[3].lane, kHostLane);
  EXPECT_EQ(rec.ops[3].bytes, 4096);
  EXPECT_EQ(rec.ops[4].lane, kCopyH2DLane);
  EXPECT_EQ(rec.ops[4].request, up);
  EXPECT_NE(up, down);
  EXPECT_NE(up, rs);
  EXPECT_EQ(rec.ops[5].kind, OpKind::Wait);
  EXPECT_EQ(rec.ops[5].lane, 0);
  b->release_host(host);
  b->release(dev);
  b->set_recorder(nullptr);
}

// count_runs: a run of alike GEMMs in a row reaches the recorder as one op with its length,
// ended by a GEMM of another shape, another context or any other event; the same ops, in
// the same order, as without runs, and the same FLOPs.
TEST(CountingBackend, RunsOfAlikeGemmsAsOneOpWithTheirCount) {
  struct Seen {
    std::vector<OpEvent> ops;
    double flops;
  };
  const auto play = [](bool runs) {
    auto b = make_counting_backend();
    Collect rec;
    b->set_recorder(&rec);
    count_runs(*b, runs);
    const Buf x = b->alloc_buf(1 << 10, DType::BF16, MemCategory::Workspace);
    const auto gemm = [&](int m) { b->gemm_batched(false, true, m, 4, 8, 1.f, x, 8, 32, x, 8, 32, 0.f, x, 4, 16, 3); };
    {
      ScopedContext fwd(*b, Phase::Forward, 2);
      for (int i = 0; i < 5; ++i) gemm(2);
      gemm(3);  // another shape
      gemm(3);
    }
    ScopedContext bwd(*b, Phase::Backward, 2);
    gemm(3);  // another phase
    b->scale(x, 2.f, 16);
    gemm(3);
    gemm(3);
    b->release(x.ptr);  // a memory change ends the run too
    gemm(3);
    count_runs(*b, false);  // hands on the run held
    b->set_recorder(nullptr);
    return Seen{rec.ops, counted_gemm_flops(*b)};
  };
  const Seen each = play(false), runs = play(true);
  ASSERT_EQ(each.ops.size(), 12u);
  for (const OpEvent& e : each.ops) EXPECT_EQ(e.times, 1);
  std::vector<int> times;
  std::vector<OpEvent> expanded;
  for (const OpEvent& e : runs.ops) {
    times.push_back(e.times);
    for (int i = 0; i < e.times; ++i) expanded.push_back(e);
  }
  EXPECT_EQ(times, (std::vector<int>{5, 2, 1, 1, 2, 1}));
  ASSERT_EQ(expanded.size(), each.ops.size());
  for (size_t i = 0; i < expanded.size(); ++i) {
    EXPECT_EQ(expanded[i].kind, each.ops[i].kind) << i;
    EXPECT_EQ(expanded[i].phase, each.ops[i].phase) << i;
    EXPECT_EQ(expanded[i].unit, each.ops[i].unit) << i;
    EXPECT_EQ(expanded[i].flops, each.ops[i].flops) << i;
    EXPECT_EQ(expanded[i].bytes, each.ops[i].bytes) << i;
    EXPECT_TRUE(std::equal(expanded[i].gemm, expanded[i].gemm + 5, each.ops[i].gemm)) << i;
  }
  EXPECT_EQ(runs.flops, each.flops);
  EXPECT_EQ(each.flops, 2.0 * 4 * 8 * 3 * (5 * 2 + 6 * 3));
}

// The ledgers' map against std::unordered_map through random inserts and removals: keys
// that collide on purpose (strides of a power of two), chains that wrap around the table,
// growth, removals from the middle of chains.
TEST(PointerMap, AgreesWithUnorderedMap) {
  PointerMap<int64_t> map;
  std::unordered_map<const void*, int64_t> want;
  uint64_t state = 12345;
  auto rnd = [&]() { return state = state * 6364136223846793005ull + 1442695040888963407ull, state >> 33; };
  for (int i = 0; i < 200000; ++i) {
    const void* key = reinterpret_cast<const void*>(uintptr_t(4096 + (rnd() % 3000) * (i % 3 ? 64 : 1 << 20)));
    if (rnd() % 3) {
      const bool fresh = want.emplace(key, int64_t(i)).second;
      ASSERT_EQ(map.insert(key, int64_t(i)), fresh);
    } else {
      int64_t got = -1;
      const auto it = want.find(key);
      ASSERT_EQ(map.take(key, &got), it != want.end());
      if (it != want.end()) {
        EXPECT_EQ(got, it->second);
        want.erase(it);
      }
    }
    ASSERT_EQ(map.size(), want.size());
  }
  for (const auto& [k, v] : want) {
    const int64_t* got = map.find(k);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(*got, v);
  }
  size_t seen = 0;
  map.for_each([&](const void* k, int64_t v) {
    ++seen;
    EXPECT_EQ(want.at(k), v);
  });
  EXPECT_EQ(seen, want.size());
  EXPECT_EQ(map.find(reinterpret_cast<const void*>(uintptr_t(8))), nullptr);
}
