// Test data for the fused attention op, shared by tests/test_backend.cpp and
// tests/gpu/test_cuda_backend.cu: random q, k, v, dO and bias table; a bucket map of j − i
// like T5's (bidirectional for the encoder, keys at or before the query for the causal
// decoder); a double-precision reference of the forward and backward; and the op run on a
// backend in any training precision.
#pragma once
#include <cmath>
#include <cstdint>
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

  // Every input rounded through t (what a t-typed run computes on).
  void round_to(DType t) {
    if (t == DType::F32) return;
    for (auto* x : {&q, &k, &v, &dout, &table})
      for (float& e : *x) e = t == DType::BF16 ? float(bf16(e)) : float(f16(e));
  }

  int64_t at(int b, int rows, int row, int h, int c) const {
    return (int64_t(b) * rows + row) * s.ld() + int64_t(h) * s.d_kv + c;
  }

  // The textbook formulas in double over a whole [tq, tk] score matrix per (b, h).
  AttnResult reference() const {
    AttnResult r;
    const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
    r.o.assign(nq, 0.f), r.dq.assign(nq, 0.f), r.dk.assign(nk, 0.f), r.dv.assign(nk, 0.f);
    r.lse.assign(int64_t(s.batch) * s.heads * s.tq, 0.f);
    std::vector<double> dtab(table.size(), 0.0), P(size_t(s.tk)), dS(size_t(s.tk));
    std::vector<double> dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h)
        for (int i = 0; i < s.tq; ++i) {
          double mx = -INFINITY;
          for (int j = 0; j < s.tk; ++j) {
            double x = -INFINITY;
            if (!(s.causal && j > i)) {
              x = bias ? table[size_t(rel[size_t(j - i + s.tq - 1)]) * s.heads + h] : 0.0;
              for (int c = 0; c < s.d_kv; ++c) x += double(q[at(b, s.tq, i, h, c)]) * k[at(b, s.tk, j, h, c)];
            }
            P[size_t(j)] = x, mx = std::max(mx, x);
          }
          double sum = 0;
          for (double& p : P) sum += (p = std::exp(p - mx));
          for (double& p : P) p /= sum;
          r.lse[(int64_t(b) * s.heads + h) * s.tq + i] = float(mx + std::log(sum));
          double rowdot = 0;  // Σ_j dP_j P_j
          for (int j = 0; j < s.tk; ++j) {
            double dp = 0;
            for (int c = 0; c < s.d_kv; ++c) dp += double(dout[at(b, s.tq, i, h, c)]) * v[at(b, s.tk, j, h, c)];
            dS[size_t(j)] = dp, rowdot += dp * P[size_t(j)];
          }
          for (int j = 0; j < s.tk; ++j) {
            const double p = P[size_t(j)], ds = p * (dS[size_t(j)] - rowdot);
            if (bias && !(s.causal && j > i)) dtab[size_t(rel[size_t(j - i + s.tq - 1)]) * s.heads + h] += ds;
            for (int c = 0; c < s.d_kv; ++c) {
              const int64_t qi = at(b, s.tq, i, h, c), kj = at(b, s.tk, j, h, c);
              r.o[qi] += float(p * v[kj]);
              dq[qi] += ds * k[kj];
              dk[kj] += ds * q[qi];
              dv[kj] += p * dout[qi];
            }
          }
        }
    for (int64_t x = 0; x < nq; ++x) r.dq[x] = float(dq[x]);
    for (int64_t x = 0; x < nk; ++x) r.dk[x] = float(dk[x]), r.dv[x] = float(dv[x]);
    for (double d : dtab) r.dtable.push_back(float(kTableStart + d));
    return r;
  }

  // The fused forward and backward on backend be with tensors of type t.
  AttnResult run(Backend& be, DType t) const {
    std::vector<void*> owned;
    auto put = [&](const std::vector<float>& h) -> Buf {
      if (h.empty()) return Buf();
      float* f = be.alloc_floats(int64_t(h.size()), MemCategory::Workspace);
      be.upload(f, h.data(), h.size() * 4);
      const Buf out = be.alloc_buf(int64_t(h.size()), t, MemCategory::Workspace);
      be.cast(out, f, int64_t(h.size()));
      be.release(f);
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
inline double norm_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    d += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    n += double(ref[i]) * ref[i];
  }
  if (got.size() != ref.size()) return INFINITY;
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

}  // namespace sb
