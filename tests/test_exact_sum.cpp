// Sums rounded once (backend/exact_sum.h): cases whose rounding a double sum cannot decide
// (near-ties, cancellation, subnormal and overflowing results) with their known floats;
// random GEMMs of heavy cancellation against a __float128 reference that is exact for them;
// and every element independent of the GEMM's shape, which BLAS does not promise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/exact_sum.h"

using namespace sb;

namespace {
float dot(std::vector<float> a, std::vector<float> b, float alpha = 1.f, float beta = 0.f, float c = 0.f) {
  exact_sgemm(false, false, 1, 1, int(a.size()), alpha, a.data(), int(a.size()), b.data(), 1, beta, &c, 1);
  return c;
}
bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }
}  // namespace

TEST(ExactSum, TiesAndStickyBits) {
  const float one = 1.f, half_ulp = std::ldexp(1.f, -24), far = std::ldexp(1.f, -80);
  EXPECT_EQ(exact_sum(std::vector<float>{one, half_ulp}.data(), 2), 1.f);  // a tie: to even
  EXPECT_EQ(exact_sum(std::vector<float>{one, half_ulp, far}.data(), 3), 1.f + std::ldexp(1.f, -23));
  EXPECT_EQ(exact_sum(std::vector<float>{one, half_ulp, -far}.data(), 3), 1.f);
  const float odd = 1.f + std::ldexp(1.f, -23);  // a tie from an odd significand rounds up
  EXPECT_EQ(exact_sum(std::vector<float>{odd, half_ulp}.data(), 2), 1.f + std::ldexp(1.f, -22));
  // The same through products and through alpha and beta.
  EXPECT_EQ(dot({std::ldexp(1.f, -40), std::ldexp(1.f, -64), std::ldexp(1.f, -60)},
                {std::ldexp(1.f, 40), std::ldexp(1.f, 40), std::ldexp(1.f, -20)}),
            1.f + std::ldexp(1.f, -23));
  EXPECT_EQ(dot({half_ulp, far}, {1.f, 1.f}, 1.f, 1.f, 1.f), 1.f + std::ldexp(1.f, -23));
}

TEST(ExactSum, CancellationSubnormalsAndOverflow) {
  const float big = std::ldexp(1.f, 100);
  EXPECT_EQ(exact_sum(std::vector<float>{big, 1.f, -big}.data(), 3), 1.f);  // a double sum gives 0
  // 2^-150 is half the smallest subnormal (a tie: to 0); a little more rounds up to it.
  const float t = std::ldexp(1.f, -75), u = std::ldexp(1.f, -100);
  EXPECT_TRUE(same_bits(dot({t}, {t}), 0.f));
  EXPECT_EQ(dot({t, u}, {t, u}), std::ldexp(1.f, -149));
  EXPECT_EQ(dot({std::ldexp(1.f, -126), -std::ldexp(1.f, -126) + std::ldexp(1.f, -146)}, {1.f, 1.f}),
            std::ldexp(1.f, -146));
  const float huge = std::ldexp(1.5f, 127);
  EXPECT_EQ(dot({huge, huge}, {1.f, 1.f}), INFINITY);
  EXPECT_EQ(dot({huge, -huge, 3.f}, {1.f, 1.f, 1.f}), 3.f);
  EXPECT_TRUE(std::isnan(dot({INFINITY, 1.f}, {0.f, 1.f})));
  EXPECT_EQ(dot({}, {}, 1.f, 2.f, 3.f), 6.f);  // no terms: beta C
}

TEST(ExactSum, AlphaScalesTheExactSum) {
  // One term times alpha: three floats' product, exact in __float128.
  std::mt19937 g(7);
  std::uniform_real_distribution<float> x(-2.f, 2.f);
  for (int i = 0; i < 10000; ++i) {
    const float a = x(g), b = x(g), alpha = i % 2 ? 1.f / std::sqrt(32.f) : x(g);
    const float want = float(__float128(alpha) * __float128(a) * __float128(b));
    EXPECT_TRUE(same_bits(dot({a}, {b}, alpha), want)) << a << " " << b << " " << alpha;
  }
}

TEST(ExactSum, RandomCancellingGemmsAgainstAnExactReference) {
  // Each column of B is u then u(1 + small): the two halves of every dot product nearly
  // cancel, so the double sum's bound rarely decides and the fixed-point path runs. Values
  // are multiples of 2^-40 below 2^4, so every partial sum is exact in __float128 (113 bits).
  std::mt19937 g(11);
  std::uniform_int_distribution<int> mant(-(1 << 23), 1 << 23), ex(-16, -8);
  auto value = [&] { return std::ldexp(float(mant(g)), ex(g) - 16); };
  const int M = 7, N = 9, K = 64;
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), C(size_t(M) * N);
  for (int trial = 0; trial < 50; ++trial) {
    for (float& a : A) a = value();
    for (int j = 0; j < N; ++j)
      for (int p = 0; p < K / 2; ++p) {
        B[size_t(p) * N + j] = value();
        B[size_t(p + K / 2) * N + j] = -B[size_t(p) * N + j] * (1.f + std::ldexp(1.f, -20) * float(p % 3));
      }
    for (int i = 0; i < M; ++i)
      for (int p = 0; p < K / 2; ++p) A[size_t(i) * K + p + K / 2] = A[size_t(i) * K + p];
    exact_sgemm(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        __float128 s = 0;
        for (int p = 0; p < K; ++p) s += __float128(A[size_t(i) * K + p]) * __float128(B[size_t(p) * N + j]);
        EXPECT_TRUE(same_bits(C[size_t(i) * N + j], float(s))) << i << " " << j;
      }
  }
}

TEST(ExactSum, AnElementDoesNotDependOnTheGemmsShape) {
  std::mt19937 g(3);
  std::normal_distribution<float> x;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int M = 24, N = 96, K = 64;
      std::vector<float> A(size_t(M) * K), B(size_t(K) * N), C(size_t(M) * N), part(size_t(M) * N);
      for (float& a : A) a = x(g);
      for (float& b : B) b = x(g);
      const int lda = ta ? M : K, ldb = tb ? K : N;
      exact_sgemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.f, C.data(), N);
      // Columns [32, 64) alone (B's rows or columns from there), then rows [8, 16) alone.
      const float* Bp = tb ? B.data() + 32 * K : B.data() + 32;
      exact_sgemm(ta, tb, M, 32, K, 0.5f, A.data(), lda, Bp, ldb, 0.f, part.data(), 32);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < 32; ++j) EXPECT_TRUE(same_bits(part[size_t(i) * 32 + j], C[size_t(i) * N + 32 + j]));
      const float* Ap = ta ? A.data() + 8 : A.data() + 8 * K;
      exact_sgemm(ta, tb, 8, N, K, 0.5f, Ap, lda, B.data(), ldb, 0.f, part.data(), N);
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < N; ++j) EXPECT_TRUE(same_bits(part[size_t(i) * N + j], C[size_t(8 + i) * N + j]));
    }
}

// What --check's tensor-parallel lockstep rests on (train/tp_lockstep.h): under
// ComputeOptions::exact_sums the CPU backend's fused attention (forward and backward, the
// bias table's gradient included) gives a subset of the heads, run alone, the same values
// as the whole, bit for bit, as a tensor-parallel rank holding those heads runs them. (It
// runs each batch and head on its own, in tiles of the same shapes, so this holds without
// exact sums too; the GEMMs around it need them: the next test.)
TEST(ExactSum, CpuBackendsFusedAttentionOfSomeHeadsAlone) {
  auto b = make_backend("cpu");
  ComputeOptions exact;
  exact.exact_sums = true;
  b->set_compute_options(exact);
  const int B = 2, H = 4, T = 70, D = 8, NB = 8, h0 = 2, Hp = 2;  // 70 keys: two tiles, two key chunks
  std::mt19937 g(5);
  std::normal_distribution<float> x;
  auto randoms = [&](size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = x(g);
    return v;
  };
  const size_t rows = size_t(B) * T;
  const std::vector<float> q = randoms(rows * H * D), k = randoms(rows * H * D), v = randoms(rows * H * D);
  const std::vector<float> dout = randoms(rows * H * D), table = randoms(size_t(NB) * H);
  std::vector<int> buckets(2 * T - 1);
  for (int r = 0; r < 2 * T - 1; ++r) buckets[size_t(r)] = std::min(NB - 1, std::abs(r - (T - 1)) / 3);
  struct Out {
    std::vector<float> o, lse, dq, dk, dv, dtable;
  };
  // Heads [first, first + heads) of every input, as a rank holding them lays them out.
  auto run = [&](int first, int heads) {
    const AttentionShape s{B, heads, T, T, D, NB, /*causal=*/true};
    auto cols = [&](const std::vector<float>& full, int width, int per) {  // heads' columns of [rows, H*per]
      std::vector<float> out;
      const size_t n = full.size() / size_t(H * per);
      for (size_t r = 0; r < n; ++r)
        out.insert(out.end(), full.begin() + long(r * H * per + first * per),
                   full.begin() + long(r * H * per + (first + width) * per));
      return out;
    };
    const std::vector<float> qh = cols(q, heads, D), kh = cols(k, heads, D), vh = cols(v, heads, D);
    const std::vector<float> dh = cols(dout, heads, D), th = cols(table, heads, 1);
    Out r;
    r.o.resize(qh.size()), r.lse.resize(size_t(B) * heads * T), r.dq.resize(qh.size());
    r.dk.resize(qh.size()), r.dv.resize(qh.size()), r.dtable.assign(th.size(), 0.f);
    std::vector<float> work(size_t(attention_workspace_floats(s, true)));
    b->attention_forward(r.o.data(), r.lse.data(), qh.data(), kh.data(), vh.data(), th.data(), buckets.data(), s);
    b->attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), r.dtable.data(), dh.data(), qh.data(), kh.data(),
                          vh.data(), r.o.data(), r.lse.data(), th.data(), buckets.data(), work.data(), s);
    return r;
  };
  const Out whole = run(0, H), part = run(h0, Hp);
  auto same_cols = [&](const std::vector<float>& w, const std::vector<float>& p, int per, const char* what) {
    const size_t n = w.size() / size_t(H * per);
    int differ = 0;
    for (size_t r = 0; r < n; ++r)
      for (int c = 0; c < Hp * per; ++c)
        differ += !same_bits(w[r * H * per + size_t(h0 * per + c)], p[r * Hp * per + size_t(c)]);
    EXPECT_EQ(differ, 0) << what;
  };
  same_cols(whole.o, part.o, D, "o");
  same_cols(whole.dq, part.dq, D, "dq");
  same_cols(whole.dk, part.dk, D, "dk");
  same_cols(whole.dv, part.dv, D, "dv");
  same_cols(whole.dtable, part.dtable, 1, "dtable");
  // lse [B, heads, T]: the heads' rows
  for (int bi = 0; bi < B; ++bi)
    for (int h = 0; h < Hp; ++h)
      for (int i = 0; i < T; ++i)
        EXPECT_TRUE(same_bits(whole.lse[(size_t(bi) * H + size_t(h0 + h)) * T + size_t(i)],
                              part.lse[(size_t(bi) * Hp + size_t(h)) * T + size_t(i)]));
}

// The CPU backend under ComputeOptions::exact_sums: its GEMM (alpha, beta, both transposes
// of B) is exact_sgemm's, and its cross-entropy's Σexp is exact_sum's, bit for bit; an
// element of a column block, computed alone, is the whole product's. (BLAS's blocked sums
// round otherwise: without the option, this GEMM differs in some elements.)
TEST(ExactSum, CpuBackendComputesWithThem) {
  auto b = make_backend("cpu");
  ComputeOptions exact;
  exact.exact_sums = true;
  b->set_compute_options(exact);
  std::mt19937 g(9);
  std::normal_distribution<float> x;
  const int M = 16, N = 96, K = 512;
  std::vector<float> A(size_t(M) * K), W(size_t(N) * K), C0(size_t(M) * N);
  for (float& a : A) a = x(g);
  for (float& w : W) w = x(g);
  for (float& c : C0) c = x(g);
  for (int tb = 0; tb < 2; ++tb) {
    std::vector<float> Wl(W);  // op(B) = W^T [K, N]: stored as W [N, K] (tb) or W^T [K, N]
    if (!tb)
      for (int n = 0; n < N; ++n)
        for (int p = 0; p < K; ++p) Wl[size_t(p) * N + n] = W[size_t(n) * K + p];
    const int ldb = tb ? K : N;
    std::vector<float> C(C0), want(C0);
    b->gemm(false, tb, M, N, K, 0.5f, A.data(), K, Wl.data(), ldb, 1.f, C.data(), N);
    exact_sgemm(false, tb, M, N, K, 0.5f, A.data(), K, Wl.data(), ldb, 1.f, want.data(), N);
    int differ = 0;
    for (size_t i = 0; i < C.size(); ++i) differ += !same_bits(C[i], want[i]);
    EXPECT_EQ(differ, 0) << "tb " << tb;
    // Columns [32, 64) alone (a tensor-parallel rank's rows of W).
    std::vector<float> part(size_t(M) * 32);
    const float* Wp = tb ? Wl.data() + 32 * K : Wl.data() + 32;
    b->gemm(false, tb, M, 32, K, 0.5f, A.data(), K, Wp, ldb, 0.f, part.data(), 32);
    std::vector<float> whole(size_t(M) * N);
    b->gemm(false, tb, M, N, K, 0.5f, A.data(), K, Wl.data(), ldb, 0.f, whole.data(), N);
    differ = 0;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < 32; ++j) differ += !same_bits(part[size_t(i) * 32 + j], whole[size_t(i) * N + 32 + j]);
    EXPECT_EQ(differ, 0) << "tb " << tb;
  }
  // Σexp of each row: the terms exp(l − max) summed exactly.
  const int n = 3, V = 1000;
  std::vector<float> logits(size_t(n) * V), row_max(n), sums(2 * n), terms(V);
  for (float& l : logits) l = 4 * x(g);
  const std::vector<int> labels{5, -1, 999};
  b->cross_entropy_max(logits.data(), row_max.data(), n, V);
  b->cross_entropy_sums(logits.data(), row_max.data(), labels.data(), sums.data(), n, V);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < V; ++j) terms[size_t(j)] = std::exp(logits[size_t(i) * V + j] - row_max[size_t(i)]);
    EXPECT_TRUE(same_bits(sums[size_t(i)], exact_sum(terms.data(), V))) << i;
  }
}
