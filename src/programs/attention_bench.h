// One T5 attention forward + backward on a backend, each path as a training step issues it
// (src/model/t5_attention.cpp, Attention::forward / backward between the Q/K/V projections
// and the output projection), for kernel_bench: unfused (batched GEMMs per sequence around
// the softmax over a held [B, H, T, T] tensor, the bias tensor added in the softmax and its
// gradient accumulated by the softmax backward) or fused (attention_forward/backward with
// the bias table inside). The per-stack bias work of the unfused path (position_bias_forward
// and _backward, once per stack) is not part of one attention. tests/test_kernel_bench.cpp
// checks that the unfused sequence records the operations of a T5 step's self-attention.
#pragma once
#include <cstdint>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/model/t5.h"

namespace sb {
namespace attention_bench {

struct Tensors {
  AttentionShape s;
  DType t = DType::F32;
  AttentionImpl impl = AttentionImpl::Unfused;
  Buf q, k, v, dout, ctx, dq, dk, dv, table, dtable;
  Buf bias, dbias, probs, ds;  // unfused
  float* lse = nullptr;        // fused
  float* workspace = nullptr;  // fused
  int* rel = nullptr;          // fused: bucket of j − i
  std::vector<void*> owned;
};

// Inputs uniform in [-1, 1) (a fixed key), the bias table and a bucket of j − i as T5's
// (a few exact buckets near the diagonal, then shared ones), the outputs allocated.
inline Tensors make(Backend& b, const AttentionShape& s, DType t, AttentionImpl impl) {
  Tensors x;
  x.s = s, x.t = t, x.impl = impl;
  const MemCategory ws = MemCategory::Workspace;
  auto buf = [&](int64_t n, uint64_t key) {
    const Buf out = b.alloc_buf(n, t, ws);
    x.owned.push_back(out.ptr);
    if (key) {
      float* f = b.alloc_floats(n, ws);
      b.init_uniform(f, n, key, 0, 1.f);
      b.cast(out, f, n);
      b.release(f);
    }
    return out;
  };
  const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
  x.q = buf(nq, 1), x.k = buf(nk, 2), x.v = buf(nk, 3), x.dout = buf(nq, 4);
  x.ctx = buf(nq, 0), x.dq = buf(nq, 0), x.dk = buf(nk, 0), x.dv = buf(nk, 0);
  x.table = buf(int64_t(s.num_buckets) * s.heads, 5);
  x.dtable = buf(int64_t(s.num_buckets) * s.heads, 0);
  b.fill(x.dtable, 0.f, int64_t(s.num_buckets) * s.heads);
  std::vector<int> rel;  // bucket of j − i, j − i = 1 − tq .. tk − 1
  const int half = s.num_buckets / 2;
  for (int r = 1 - s.tq; r < s.tk; ++r) {
    const int a = r < 0 ? -r : r, exact = a < half / 2 ? a : half / 2 + a / 16;
    rel.push_back((r > 0 && !s.causal ? half : 0) + (exact < half - 1 ? exact : half - 1));
  }
  if (impl == AttentionImpl::Fused) {
    x.rel = b.alloc_ints(int64_t(rel.size()), ws);
    b.upload(x.rel, rel.data(), rel.size() * sizeof(int));
    x.lse = b.alloc_floats(int64_t(s.batch) * s.heads * s.tq, ws);
    x.workspace = b.alloc_floats(attention_workspace_floats(s, true), ws);
    x.owned.insert(x.owned.end(), {x.rel, x.lse, x.workspace});
    return x;
  }
  const int64_t tt = int64_t(s.tq) * s.tk;
  std::vector<int> buckets(static_cast<size_t>(tt));  // the unfused path's [tq, tk] map
  for (int i = 0; i < s.tq; ++i)
    for (int j = 0; j < s.tk; ++j) buckets[size_t(i) * s.tk + j] = rel[size_t(j - i + s.tq - 1)];
  int* bk = b.alloc_ints(tt, ws);
  b.upload(bk, buckets.data(), buckets.size() * sizeof(int));
  x.bias = buf(s.heads * tt, 0), x.dbias = buf(s.heads * tt, 0);
  b.position_bias_forward(x.bias, x.table, bk, s.heads, s.tq, s.tk);  // once per stack, not timed
  b.fill(x.dbias, 0.f, s.heads * tt);
  b.release(bk);
  x.probs = buf(int64_t(s.batch) * s.heads * tt, 0), x.ds = buf(int64_t(s.batch) * s.heads * tt, 0);
  return x;
}

inline void release(Backend& b, Tensors& x) {
  for (void* p : x.owned) b.release(p);
  x.owned.clear();
}

// One attention forward and backward, the operations and shapes of T5Step's.
inline void forward_backward(Backend& b, const Tensors& x) {
  const AttentionShape& s = x.s;
  if (x.impl == AttentionImpl::Fused) {
    b.attention_forward(x.ctx, x.lse, x.q, x.k, x.v, x.table, x.rel, s);
    b.attention_backward(x.dq, x.dk, x.dv, x.dtable, x.dout, x.q, x.k, x.v, x.ctx, x.lse, x.table, x.rel, x.workspace,
                         s);
    return;
  }
  const int B = s.batch, H = s.heads, tq = s.tq, tk = s.tk, dkv = s.d_kv, inner = int(s.ld());
  const int64_t sq = int64_t(tq) * inner, sk = int64_t(tk) * inner, ss = int64_t(H) * tq * tk, sp = int64_t(tq) * tk;
  // The step's calls (T5Step's unfused attention): per sequence, its heads one batched GEMM.
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(false, true, tq, tk, dkv, 1.f, x.q + bi * sq, inner, dkv, x.k + bi * sk, inner, dkv, 0.f,
                   x.probs + bi * ss, tk, sp, H);  // scores_bh = q_bh k_bh^T
  b.softmax_forward(x.probs, x.bias, s.causal, B, H, tq, tk);
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(false, false, tq, dkv, tk, 1.f, x.probs + bi * ss, tk, sp, x.v + bi * sk, inner, dkv, 0.f,
                   x.ctx + bi * sq, inner, dkv, H);  // ctx_bh = P_bh v_bh
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(false, true, tq, tk, dkv, 1.f, x.dout + bi * sq, inner, dkv, x.v + bi * sk, inner, dkv, 0.f,
                   x.ds + bi * ss, tk, sp, H);  // dP = dctx v^T
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(true, false, tk, dkv, tq, 1.f, x.probs + bi * ss, tk, sp, x.dout + bi * sq, inner, dkv, 0.f,
                   x.dv + bi * sk, inner, dkv, H);  // dv = P^T dctx
  b.softmax_backward(x.ds, x.probs, x.dbias, B, H, tq, tk);
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(false, false, tq, dkv, tk, 1.f, x.ds + bi * ss, tk, sp, x.k + bi * sk, inner, dkv, 0.f,
                   x.dq + bi * sq, inner, dkv, H);  // dq = dS k
  for (int bi = 0; bi < B; ++bi)
    b.gemm_batched(true, false, tk, dkv, tq, 1.f, x.ds + bi * ss, tk, sp, x.q + bi * sq, inner, dkv, 0.f,
                   x.dk + bi * sk, inner, dkv, H);  // dk = dS^T q
}

}  // namespace attention_bench
}  // namespace sb
