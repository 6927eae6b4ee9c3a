// Sums rounded once (exact_sum.h). Every term is a float or a product of two floats, so it is
// exact in double (24 + 24 significant bits, exponents from -298 to 256). A double sum in
// ascending order with its error bound decides the rounding of nearly every element; where
// the bound straddles a rounding boundary (a near-tie, heavy cancellation) the terms are
// summed again exactly in fixed point and rounded from there.
#include "shardbench/backend/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "shardbench/core/check.h"

namespace sb {
namespace {

// The exact value of a sum of terms m·2^e (m an integer of at most 53 bits, m·2^e >= 2^-350):
// 32-bit digits in int64 limbs whose carries are settled only when read, so 2^31 terms fit;
// bit 0 of limb 0 is worth 2^(kBase + shift_).
class FixedPointSum {
 public:
  // x: a float or a product of two floats (or 0).
  void add(double x) {
    if (x == 0) return;
    int e = 0;
    const double f = std::frexp(x, &e);  // x = f 2^e, 1/2 <= |f| < 1
    place(int64_t(std::ldexp(f, 53)), e - 53);
  }
  // The sum times a (exactly: by a's odd integer significand, its power of two kept aside).
  void scale(float a) {
    if (a == 0) {
      std::fill(limb_, limb_ + kLimbs, 0);
      return;
    }
    int e = 0;
    int64_t m = int64_t(std::ldexp(std::frexp(a, &e), 24));  // a = m 2^(e-24), |m| < 2^24
    e -= 24;
    for (; m % 2 == 0; m /= 2) ++e;
    settle(limb_);  // digits below 2^32, so each product stays below 2^56
    for (int64_t& l : limb_) l *= m;
    shift_ += e;
  }
  // The sum rounded to the nearest float, ties to even (the float overflows to ±inf).
  float round() const {
    int64_t n[kLimbs];
    std::copy(limb_, limb_ + kLimbs, n);
    settle(n);
    const bool negative = n[kLimbs - 1] < 0;
    if (negative) {
      for (int64_t& l : n) l = -l;
      settle(n);
    }
    int top = kLimbs - 1;
    while (top >= 0 && n[top] == 0) --top;
    if (top < 0) return 0.f;
    const int P = 32 * top + 63 - __builtin_clzll(uint64_t(n[top]));  // the highest set bit
    const int unit = kBase + shift_;                                   // the worth of bit 0
    // The float's last bit: 23 below the highest, or 2^-149 (subnormal) if that is higher.
    const int L = std::max(P - 23, -149 - unit);
    double r;
    if (L <= 0) {  // every bit fits: the value is a float (P <= 23: limb 0 holds it all)
      r = std::ldexp(double(n[0]), unit);
    } else {
      auto bit = [&](int j) -> int64_t {
        const int i = std::min(j / 32, kLimbs - 1);
        return (n[i] >> (j - 32 * i)) & 1;
      };
      int64_t mant = 0;
      for (int j = P; j >= L; --j) mant = mant << 1 | bit(j);
      bool sticky = false;  // any bit below the rounding bit
      for (int j = 0; j < L - 1 && !sticky; ++j) sticky = bit(j);
      if (bit(L - 1) && (sticky || (mant & 1))) ++mant;
      r = std::ldexp(double(mant), L + unit);  // a float, 2^128 at most (which overflows below)
    }
    return float(negative ? -r : r);
  }

 private:
  static constexpr int kBase = -352, kLimbs = 22;  // up to 2^352: sums of 2^31 products near 2^256
  void place(int64_t m, int e) {
    const int pos = e - kBase - shift_;
    SB_ASSERT(pos >= 0 && pos / 32 + 2 < kLimbs, "exact sum: a term outside the fixed-point range");
    const unsigned __int128 v = static_cast<unsigned __int128>(m < 0 ? -m : m) << (pos % 32);
    const int i = pos / 32;
    const int64_t s = m < 0 ? -1 : 1;
    limb_[i] += s * int64_t(v & 0xffffffffu);
    limb_[i + 1] += s * int64_t((v >> 32) & 0xffffffffu);
    limb_[i + 2] += s * int64_t(v >> 64);
  }
  // Carries up: every limb but the top one a digit in [0, 2^32); the top one holds the sign.
  static void settle(int64_t* n) {
    for (int i = 0; i + 1 < kLimbs; ++i) {
      const int64_t carry = n[i] >> 32;  // floor(n / 2^32), also for negative n
      n[i] -= carry * (int64_t(1) << 32);
      n[i + 1] += carry;
    }
  }
  int64_t limb_[kLimbs] = {};
  int shift_ = 0;
};

// alpha·Σ t_j + c rounded once, where d = Σ t_j summed in double in ascending order and
// s = Σ |t_j| (k terms), c = beta·C exact; `exact` sums the terms again in fixed point when
// the double's error bound does not decide the rounding.
template <class Terms>
float round_once(double d, double s, int64_t k, float alpha, double c, Terms&& exact) {
  const double v = double(alpha) * d + c;
  if (!std::isfinite(v)) return float(v);  // an inf or nan among the terms: IEEE's result
  // |d − Σt| <= (k−1)·2^-53·Σ|t| (s itself a little low); then the product and the sum's roundings.
  const double err = std::fabs(double(alpha)) * double(k) * 0x1p-52 * s + 0x1p-52 * (std::fabs(double(alpha) * d) + std::fabs(v));
  if (float(v - 2 * err) == float(v + 2 * err)) return float(v);  // every value in reach rounds alike
  FixedPointSum x;
  exact(x);
  if (alpha != 1.f) x.scale(alpha);
  x.add(c);
  return x.round();
}

}  // namespace

void exact_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                 int ldb, float beta, float* c, int ldc) {
  // op(B) as [k, n] doubles, so a row of C accumulates over contiguous rows of B in
  // ascending k (vectorised across the row; each element's order stays k = 0, 1, ...).
  std::vector<double> B(size_t(k) * n), A(static_cast<size_t>(k)), D(static_cast<size_t>(n)), S(static_cast<size_t>(n));
  for (int p = 0; p < k; ++p)
    for (int j = 0; j < n; ++j) B[size_t(p) * n + j] = tb ? b[int64_t(j) * ldb + p] : b[int64_t(p) * ldb + j];
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) A[size_t(p)] = ta ? a[int64_t(p) * lda + i] : a[int64_t(i) * lda + p];
    std::fill(D.begin(), D.end(), 0.0);
    std::fill(S.begin(), S.end(), 0.0);
    for (int p = 0; p < k; ++p) {
      const double x = A[size_t(p)];
      const double* row = B.data() + size_t(p) * n;
      for (int j = 0; j < n; ++j) {
        const double t = x * row[j];  // exact
        D[size_t(j)] += t;
        S[size_t(j)] += std::fabs(t);
      }
    }
    float* ci = c + int64_t(i) * ldc;
    for (int j = 0; j < n; ++j) {
      const double cj = beta != 0.f ? double(beta) * double(ci[j]) : 0.0;  // beta 0: C is not read
      ci[j] = round_once(D[size_t(j)], S[size_t(j)], k, alpha, cj, [&](FixedPointSum& x) {
        for (int p = 0; p < k; ++p) x.add(A[size_t(p)] * B[size_t(p) * n + j]);
      });
    }
  }
}

float exact_sum(const float* x, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) d += x[i], s += std::fabs(double(x[i]));
  return round_once(d, s, n, 1.f, 0.0, [&](FixedPointSum& f) {
    for (int64_t i = 0; i < n; ++i) f.add(x[i]);
  });
}

}  // namespace sb
