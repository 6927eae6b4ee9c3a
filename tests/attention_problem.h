// Test data for the fused attention op, shared by tests/test_backend.cpp and
// tests/gpu/test_cuda_backend.cu: random q, k, v, dO and bias table; a bucket map of j − i
// like T5's (bidirectional for the encoder, keys at or before the query for the causal
// decoder); a double-precision reference of the forward and backward; and the op run on a
// backend in any training precision.
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/core/rng.h"
#include "t5_model.h"  // download_f32

namespace sb {

struct AttnResult {
  std::vector<float> o, lse, dq, dk, dv, dtable;
};

struct AttnProblem {
  static constexpr float kTableStart = 0.25f;  // dtable's value before the backward adds to it
  AttentionShape s;
  bool bias;
  std::vector<float> q, k, v, dout, table;
  std::vector<int> rel;  // [tq + tk - 1]

  AttnProblem(const AttentionShape& shape, bool with_bias, uint64_t key) : s(shape), bias(with_bias) {
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    q = random(nq, key), k = random(nk, key + 1), v = random(nk, key + 2), dout = random(nq, key + 3);
    if (!bias) return;
    table = random(int64_t(s.num_buckets) * s.heads, key + 4);
    const int half = s.num_buckets / 2;
    for (int r = 1 - s.tq; r < s.tk; ++r) {  // r = j - i; a few exact buckets, then shared ones
      const int a = std::abs(r) < 6 ? std::abs(r) : 6 + std::abs(r) / 16;
      rel.push_back(s.causal ? std::min(a, s.num_buckets - 1) : (r > 0 ? half : 0) + std::min(a, half - 1));
    }
  }

  static std::vector<float> random(int64_t n, uint64_t key) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = uniform_pm1(key, uint64_t(i));
    return x;
  }

  // Every input rounded through t (what a t-typed run computes on); the backward's
  // reference then reads the forward's output as a t-typed run stores it (below).
  DType stored = DType::F32;
  void round_to(DType t) {
    stored = t;
    if (t == DType::F32) return;
    for (auto* x : {&q, &k, &v, &dout, &table})
      for (float& e : *x) e = t == DType::BF16 ? float(bf16(e)) : float(f16(e));
  }

  // x as an output of the stored type holds it (an fp32 output: rounded to float).
  double as_stored(double x) const {
    const float f = float(x);
    return stored == DType::BF16 ? float(bf16(f)) : stored == DType::F16 ? float(f16(f)) : f;
  }

  int64_t at(int b, int rows, int row, int h, int c) const {
    return (int64_t(b) * rows + row) * s.ld() + int64_t(h) * s.d_kv + c;
  }

  // The textbook formulas in double over a whole [tq, tk] score matrix per (b, h); the
  // backward's row sum D = Σ dO⊙O reads O rounded to the stored type, as the op does (its
  // backward takes the forward's stored output), so the rounding of O is not charged to
  // dq, dk and the table gradient. With
  // `scale`, also the magnitudes each output is formed from (the same sums over absolute
  // values: Σ_j P|v| for o, Σ_j P(|dP| + |D|)|k| for dq, ...): the scale a rounding error is
  // relative to. An output that is a cancellation (dq and dk with one key, where P = 1 and
  // dS = P(dP − D) = 0 up to rounding) has a tiny value but not a tiny scale.
  AttnResult reference(AttnResult* scale = nullptr) const {
    AttnResult r, m;
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    r.o.assign(nq, 0.f), r.dq.assign(nq, 0.f), r.dk.assign(nk, 0.f), r.dv.assign(nk, 0.f);
    r.lse.assign(int64_t(s.batch) * s.heads * s.tq, 0.f);
    m = r;
    std::vector<double> dtab(table.size(), 0.0), P(size_t(s.tk)), dS(size_t(s.tk)), adP(size_t(s.tk));
    std::vector<double> dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0), mdtab(table.size(), 0.0);
    std::vector<double> mo(nq, 0.0), mdq(nq, 0.0), mdk(nk, 0.0), mdv(nk, 0.0);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int i = 0; i < s.tq; ++i) {
          double mx = -INFINITY, amx = 0;  // amx: the largest |score| (lse's scale)
          for (int j = 0; j < s.tk; ++j) {
            double x = -INFINITY;
            if (!(s.causal && j > i)) {
              x = bias ? table[size_t(rel[size_t(j - i + s.tq - 1)]) * s.heads + h] : 0.0;
              for (int c = 0; c < s.d_kv; ++c) x += double(q[at(b, s.tq, i, h, c)]) * k[at(b, s.tk, j, h, c)];
              amx = std::max(amx, std::fabs(x));
            }
            P[size_t(j)] = x, mx = std::max(mx, x);
          }
          double sum = 0;
          for (double& p : P) sum += (p = std::exp(p - mx));
          for (double& p : P) p /= sum;
          const int64_t row = (int64_t(b) * s.heads + h) * s.tq + i;
          r.lse[row] = float(mx + std::log(sum));
          m.lse[row] = float(amx + std::log(sum));
          double rowdot = 0, arowdot = 0;  // Σ_c dO_c·stored(O_c) and Σ_j |dP|_j P_j
          for (int c = 0; c < s.d_kv; ++c) {
            double oc = 0;
            for (int j = 0; j < s.tk; ++j) oc += P[size_t(j)] * v[at(b, s.tk, j, h, c)];
            rowdot += double(dout[at(b, s.tq, i, h, c)]) * as_stored(oc);
          }
          for (int j = 0; j < s.tk; ++j) {
            double dp = 0, adp = 0;
            for (int c = 0; c < s.d_kv; ++c) {
              const double x = double(dout[at(b, s.tq, i, h, c)]) * v[at(b, s.tk, j, h, c)];
              dp += x, adp += std::fabs(x);
            }
            dS[size_t(j)] = dp, adP[size_t(j)] = adp, arowdot += adp * P[size_t(j)];
          }
          for (int j = 0; j < s.tk; ++j) {
            const double p = P[size_t(j)], ds = p * (dS[size_t(j)] - rowdot), ads = p * (adP[size_t(j)] + arowdot);
            if (bias && !(s.causal && j > i)) {
              const size_t t = size_t(rel[size_t(j - i + s.tq - 1)]) * s.heads + h;
              dtab[t] += ds, mdtab[t] += ads;
            }
            for (int c = 0; c < s.d_kv; ++c) {
              const int64_t qi = at(b, s.tq, i, h, c), kj = at(b, s.tk, j, h, c);
              r.o[qi] += float(p * v[kj]);
              dq[qi] += ds * k[kj];
              dk[kj] += ds * q[qi];
              dv[kj] += p * dout[qi];
              mo[qi] += p * std::fabs(v[kj]);
              mdq[qi] += ads * std::fabs(k[kj]);
              mdk[kj] += ads * std::fabs(q[qi]);
              mdv[kj] += p * std::fabs(dout[qi]);
            }
          }
        }
    for (int64_t x = 0; x < nq; ++x) r.dq[x] = float(dq[x]), m.o[x] = float(mo[x]), m.dq[x] = float(mdq[x]);
    for (int64_t x = 0; x < nk; ++x)
      r.dk[x] = float(dk[x]), r.dv[x] = float(dv[x]), m.dk[x] = float(mdk[x]), m.dv[x] = float(mdv[x]);
    for (size_t t = 0; t < dtab.size(); ++t) {
      r.dtable.push_back(float(kTableStart + dtab[t]));
      m.dtable.push_back(float(kTableStart + mdtab[t]));
    }
    if (scale) *scale = m;
    return r;
  }

  // The fused forward and backward on backend be with tensors of type t.
  AttnResult run(Backend& be, DType t) const {
    std::vector<void*> owned;
    auto put = [&](const std::vector<float>& h) -> Buf {
      if (h.empty()) return Buf();
      const Buf out = upload_as(be, h, t);
      owned.push_back(out.ptr);
      return out;
    };
    auto make = [&](int64_t n) {
      const Buf out = be.alloc_buf(n, t, MemCategory::Workspace);
      owned.push_back(out.ptr);
      return out;
    };
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    const int64_t rows = int64_t(s.batch) * s.heads * s.tq;
    const Buf bq = put(q), bk = put(k), bv = put(v), bd = put(dout), bt = put(table);
    const Buf o = make(nq), dq = make(nq), dk = make(nk), dv = make(nk);
    const Buf dt = bias ? put(std::vector<float>(table.size(), kTableStart)) : Buf();
    float* lse = be.alloc_floats(rows, MemCategory::Workspace);
    int* rb = nullptr;
    if (bias) {
      rb = be.alloc_ints(int64_t(rel.size()), MemCategory::Workspace);
      be.upload(rb, rel.data(), rel.size() * sizeof(int));
    }
    // The workspace's contents are undefined on entry: start from NaN.
    const int64_t nw = attention_workspace_floats(s, bias);
    float* ws = be.alloc_floats(nw, MemCategory::Workspace);
    be.fill(ws, NAN, nw);
    be.attention_forward(o, lse, bq, bk, bv, bt, rb, s);
    be.attention_backward(dq, dk, dv, dt, bd, bq, bk, bv, o, lse, bt, rb, ws, s);
    AttnResult r{download_f32(be, o, nq), download_f32(be, lse, rows), download_f32(be, dq, nq),
                 download_f32(be, dk, nk), download_f32(be, dv, nk), {}};
    if (bias) r.dtable = download_f32(be, dt, int64_t(table.size()));
    for (void* p : owned) be.release(p);
    for (void* p : {static_cast<void*>(lse), static_cast<void*>(rb), static_cast<void*>(ws)}) be.release(p);
    return r;
  }
};

// Normwise relative error ‖got − ref‖₂ / ‖ref‖₂ (0 for two empty vectors).
// Meaningless where ref is a cancellation (almost zero): use scaled_error there.
inline double norm_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    d += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    n += double(ref[i]) * ref[i];
  }
  if (got.size() != ref.size()) return INFINITY;
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// ‖got − ref‖₂ / ‖scale‖₂, scale the magnitudes ref was formed from (reference(&scale)):
// rounding errors are relative to these, whatever cancellation made of ref.
inline double scaled_error(const std::vector<float>& got, const std::vector<float>& ref,
                           const std::vector<float>& scale) {
  if (got.size() != ref.size() || scale.size() != ref.size()) return INFINITY;
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    n += double(scale[i]) * scale[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// The six outputs of the op by name, in this order (o, lse, dq, dk, dv, dtable).
inline std::vector<std::pair<const char*, const std::vector<float>*>> attention_outputs(const AttnResult& r) {
  return {{"o", &r.o}, {"lse", &r.lse}, {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}, {"dtable", &r.dtable}};
}

// Unit roundoffs (half an ulp at 1, round to nearest): 8 significant bits in bf16, 11 in fp16.
constexpr double kRoundBf16 = 1.0 / 256, kRoundF16 = 1.0 / 2048;
inline double unit_roundoff(DType t) { return t == DType::BF16 ? kRoundBf16 : t == DType::F16 ? kRoundF16 : 0.0; }

// What an implementation may differ from the exact result on the same (rounded) inputs, per
// output: ‖got − ref‖ ≤ out·‖ref‖ + (math, or mma for o, dq, dk, dv)·‖scale‖.
//   out:  the one rounding of the stored output (relative to its own value; lse and the
//         fp32 parts of the table gradient are not rounded, the 0 of fp32 tensors)
//   math: fp32 arithmetic (relative to the magnitudes summed)
//   mma:  a kernel that rounds P (for o and dv) or dS (for dq and dk) to the 16-bit type of
//         a tensor-core operand: each term of those sums moves by at most u·|term|.
struct AttnTolerance {
  double out = 0, math = 1e-5, mma = 1e-5;
  static AttnTolerance of(DType t, bool tensor_cores) {
    AttnTolerance x;
    x.out = unit_roundoff(t);
    if (tensor_cores) x.mma = x.math + unit_roundoff(t);
    return x;
  }
};
// Output x's error over its bound (≤ 1: within). lse is fp32 whatever the tensors' type.
inline double attention_error_ratio(const std::vector<float>& got, const std::vector<float>& ref,
                                    const std::vector<float>& scale, const AttnTolerance& tol, int x) {
  double nr = 0, ns = 0;
  for (size_t i = 0; i < ref.size() && i < scale.size(); ++i) nr += double(ref[i]) * ref[i], ns += double(scale[i]) * scale[i];
  const bool through_mma = x == 0 || (x >= 2 && x <= 4);
  const double bound = (x == 1 ? 0.0 : tol.out) * std::sqrt(nr) + (through_mma ? tol.mma : tol.math) * std::sqrt(ns);
  const double e = scaled_error(got, ref, scale) * std::sqrt(ns);  // ‖got − ref‖
  return bound > 0 ? e / bound : (e > 0 ? INFINITY : 0.0);
}

}  // namespace sb
