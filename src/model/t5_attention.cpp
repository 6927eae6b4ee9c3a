// Attention and the relative position bias (t5_parts.h). Attention runs unfused (batched
// GEMMs around a softmax over a held [B, H, tq, tk] tensor, the reference) or fused
// (Backend::attention_forward/backward, which read the rel_bias table directly and save only
// each row's logsumexp); AttentionImpl picks. T5 does not scale scores by 1/sqrt(d_kv).
#include <cmath>
#include <cstdlib>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "t5_parts.h"

namespace sb {
namespace t5 {
namespace {

// Hugging Face T5Attention._relative_position_bucket; relative_position = key - query.
// The log branch is evaluated in float32 like the PyTorch original (its divisor
// math.log(max_distance / max_exact) is a Python double), then truncated toward zero.
int relative_position_bucket(int relative_position, bool bidirectional, int num_buckets,
                             int max_distance) {
  int bucket = 0;
  int n = num_buckets;
  int rp = relative_position;
  if (bidirectional) {
    n /= 2;
    if (rp > 0) bucket += n;
    rp = std::abs(rp);
  } else {
    rp = rp < 0 ? -rp : 0;  // -min(rp, 0): only keys at or before the query
  }
  const int max_exact = n / 2;
  if (rp < max_exact) return bucket + rp;
  const float log_range = float(std::log(double(max_distance) / double(max_exact)));
  const float scaled = std::log(float(rp) / float(max_exact)) / log_range * float(n - max_exact);
  int large = max_exact + int(scaled);
  if (large > n - 1) large = n - 1;
  return bucket + large;
}

}  // namespace

void Attention::allocate() {
  Backend& b = c_.b;
  const ModelSpec& s = c_.spec;
  const MemCategory ws = MemCategory::Workspace;
  for (int st = 0; st < 2; ++st) {
    if (!c_.runs(st == 0 ? Piece::EncoderBlock : Piece::DecoderBlock)) continue;
    const int T = c_.seq(st);
    if (c_.fused()) {  // the bucket of j - i, for j - i = -(T-1) .. T-1
      std::vector<int> rel(b.holds_data() ? size_t(2 * T - 1) : 0);
      for (int r = 1 - T; r < T && b.holds_data(); ++r)
        rel[size_t(r + T - 1)] = relative_position_bucket(r, /*bidirectional=*/st == 0, int(s.num_buckets),
                                                          int(s.max_distance));
      buckets_[st] = b.alloc_ints(2 * T - 1, ws);
      if (b.holds_data()) b.upload(buckets_[st], rel.data(), rel.size() * sizeof(int));
      dbias_[st] = b.alloc_buf(c_.table_numel(), c_.dtype, ws);
      continue;
    }
    buckets_[st] = b.alloc_ints(int64_t(T) * T, ws);
    // One row at a time (host memory O(T), not O(T²)); nothing at all for the plan.
    std::vector<int> row(b.holds_data() ? T : 0);
    for (int i = 0; i < T && b.holds_data(); ++i) {
      for (int j = 0; j < T; ++j)
        row[j] = relative_position_bucket(j - i, /*bidirectional=*/st == 0, int(s.num_buckets), int(s.max_distance));
      b.upload(buckets_[st] + int64_t(i) * T, row.data(), row.size() * sizeof(int));
    }
    dbias_[st] = b.alloc_buf(int64_t(c_.H) * T * T, c_.dtype, ws);
    if (c_.stack_divided(st)) dtable_[st] = b.alloc_buf(c_.table_numel(), c_.dtype, ws);
  }
}

void Attention::release() {
  for (void* p : {(void*)buckets_[0], (void*)buckets_[1], dbias_[0].ptr, dbias_[1].ptr, dtable_[0].ptr, dtable_[1].ptr})
    c_.b.release(p);
}

int64_t Attention::dbias_numel(int stack) const {
  return c_.fused() ? c_.table_numel() : int64_t(c_.H) * c_.seq(stack) * c_.seq(stack);
}
AttentionShape Attention::shape(int tq, int tk, bool causal) const {
  return AttentionShape{c_.B, c_.H, tq, tk, c_.dkv, int(c_.spec.num_buckets), causal};
}
bool Attention::stack_continues(int stack) const { return (stack == 0 ? c_.L : 2 * c_.L + 1) >= c_.part.last; }

AttnState Attention::alloc_state(std::vector<void*>& o, MemCategory cat, int tq, int tk) {
  const int64_t B = c_.B, d = c_.d, inner = c_.inner;
  AttnState a;
  a.rstd = c_.alloc_f32(o, B * tq, cat);
  a.xn = c_.alloc(o, B * tq * d, cat);
  a.q = c_.alloc(o, B * tq * inner, cat);
  a.k = c_.alloc(o, B * tk * inner, cat);
  a.v = c_.alloc(o, B * tk * inner, cat);
  if (c_.fused())
    a.lse = c_.alloc_f32(o, B * c_.H * tq, cat);
  else
    a.probs = c_.alloc(o, B * c_.H * tq * tk, cat);
  a.ctx = c_.alloc(o, B * tq * inner, cat);
  return a;
}

void Attention::forward(const Micro& mb, CBuf W, const AttentionTensors& t, AttnState& a, CBuf xkv, int tq, int tk,
                        int bias_stack, bool causal, Buf out) {
  Backend& b = c_.b;
  const int B = c_.B, d = c_.d, inner = c_.inner, H = c_.H, dkv = c_.dkv;
  const CBuf wq = t.q.in(W), wk = t.k.in(W), wv = t.v.in(W), wo = t.o.in(W);
  b.gemm(false, true, B * tq, inner, d, 1.f, a.xn, d, wq, d, 0.f, a.q, inner);  // q = xn Wq^T
  b.gemm(false, true, B * tk, inner, d, 1.f, xkv, d, wk, d, 0.f, a.k, inner);   // k [B*tk, inner]
  b.gemm(false, true, B * tk, inner, d, 1.f, xkv, d, wv, d, 0.f, a.v, inner);   // v [B*tk, inner]
  if (c_.fused()) {
    b.attention_forward(a.ctx, a.lse, a.q, a.k, a.v, bias_stack >= 0 ? CBuf(mb.bias[bias_stack]) : CBuf(),
                        bias_stack >= 0 ? buckets_[bias_stack] : nullptr, shape(tq, tk, causal));
  } else {
    const int64_t sq = int64_t(tq) * inner, sk = int64_t(tk) * inner, ss = int64_t(H) * tq * tk;
    // per sequence bi: scores_bh [tq, tk] = q_bh k_bh^T, heads at column offset dkv
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(false, true, tq, tk, dkv, 1.f, a.q + bi * sq, inner, dkv, a.k + bi * sk, inner, dkv, 0.f,
                     a.probs + bi * ss, tk, int64_t(tq) * tk, H);
    b.softmax_forward(a.probs, bias_stack >= 0 ? CBuf(mb.bias[bias_stack]) : CBuf(), causal, B, H, tq, tk);
    // per sequence: ctx_bh [tq, dkv] = P_bh v_bh
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(false, false, tq, dkv, tk, 1.f, a.probs + bi * ss, tk, int64_t(tq) * tk, a.v + bi * sk, inner,
                     dkv, 0.f, a.ctx + bi * sq, inner, dkv, H);
  }
  c_.add_row_parallel(out, int64_t(B) * tq * d, t.output_sum, [&](Buf dst, float beta) {  // out += ctx Wo^T
    b.gemm(false, true, B * tq, d, inner, 1.f, a.ctx, inner, wo, inner, beta, dst, d);
  });
}

void Attention::backward(const Micro& mb, CBuf W, Buf G, const AttentionTensors& t, const AttnState& a, CBuf xkv,
                         int tq, int tk, CBuf dout, Buf dxn, Buf dxkv, int bias_stack, bool causal) {
  Backend& b = c_.b;
  const int B = c_.B, d = c_.d, inner = c_.inner, H = c_.H, dkv = c_.dkv;
  const CBuf wq = t.q.in(W), wk = t.k.in(W), wv = t.v.in(W), wo = t.o.in(W);
  const Buf gq = t.q.in(G), gk = t.k.in(G), gv = t.v.in(G), go = t.o.in(G);
  std::vector<void*> tmp;
  const MemCategory ws = MemCategory::Workspace;
  const Buf dctx = c_.alloc(tmp, int64_t(B) * tq * inner, ws);    // [B*tq, inner]
  const Buf ds = c_.fused() ? Buf() : c_.alloc(tmp, int64_t(B) * H * tq * tk, ws);  // [B, H, tq, tk]
  const Buf dq = c_.alloc(tmp, int64_t(B) * tq * inner, ws);      // [B*tq, inner]
  const Buf dk = c_.alloc(tmp, int64_t(B) * tk * inner, ws);      // [B*tk, inner]
  const Buf dv = c_.alloc(tmp, int64_t(B) * tk * inner, ws);      // [B*tk, inner]

  b.gemm(true, false, d, inner, B * tq, 1.f, dout, d, a.ctx, inner, 1.f, go, inner);  // dWo += dout^T ctx
  c_.ready(t.o);
  b.gemm(false, false, B * tq, inner, d, 1.f, dout, d, wo, inner, 0.f, dctx, inner);  // dctx = dout Wo
  const bool with_bias = bias_stack >= 0;
  if (c_.fused()) {
    const AttentionShape sh = shape(tq, tk, causal);
    float* work = c_.alloc_f32(tmp, attention_workspace_floats(sh, with_bias), ws);
    b.attention_backward(dq, dk, dv, with_bias ? dbias_[bias_stack] : Buf(), dctx, a.q, a.k, a.v, a.ctx, a.lse,
                         with_bias ? CBuf(mb.bias[bias_stack]) : CBuf(), with_bias ? buckets_[bias_stack] : nullptr,
                         work, sh);
  } else {
    const int64_t sq = int64_t(tq) * inner, sk = int64_t(tk) * inner, ss = int64_t(H) * tq * tk;
    const int64_t sp = int64_t(tq) * tk;
    // per sequence (each call writes its own outputs, so the order of the calls is free):
    // dP_bh [tq, tk] = dctx_bh v_bh^T, dv_bh [tk, dkv] = P_bh^T dctx_bh
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(false, true, tq, tk, dkv, 1.f, dctx + bi * sq, inner, dkv, a.v + bi * sk, inner, dkv, 0.f,
                     ds + bi * ss, tk, sp, H);
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(true, false, tk, dkv, tq, 1.f, a.probs + bi * ss, tk, sp, dctx + bi * sq, inner, dkv, 0.f,
                     dv + bi * sk, inner, dkv, H);
    b.softmax_backward(ds, a.probs, with_bias ? dbias_[bias_stack] : Buf(), B, H, tq, tk);  // ds = dS
    // dq_bh [tq, dkv] = dS_bh k_bh, dk_bh [tk, dkv] = dS_bh^T q_bh
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(false, false, tq, dkv, tk, 1.f, ds + bi * ss, tk, sp, a.k + bi * sk, inner, dkv, 0.f,
                     dq + bi * sq, inner, dkv, H);
    for (int bi = 0; bi < B; ++bi)
      b.gemm_batched(true, false, tk, dkv, tq, 1.f, ds + bi * ss, tk, sp, a.q + bi * sq, inner, dkv, 0.f,
                     dk + bi * sk, inner, dkv, H);
  }
  b.gemm(true, false, inner, d, B * tq, 1.f, dq, inner, a.xn, d, 1.f, gq, d);  // dWq += dq^T xn
  c_.ready(t.q);
  b.gemm(true, false, inner, d, B * tk, 1.f, dk, inner, xkv, d, 1.f, gk, d);   // dWk += dk^T xkv
  c_.ready(t.k);
  b.gemm(true, false, inner, d, B * tk, 1.f, dv, inner, xkv, d, 1.f, gv, d);   // dWv += dv^T xkv
  c_.ready(t.v);
  b.gemm(false, false, B * tq, d, inner, 1.f, dq, inner, wq, d, 0.f, dxn, d);  // dxn = dq Wq
  c_.rounded(dxn, int64_t(B) * tq * d);
  b.gemm(false, false, B * tk, d, inner, 1.f, dk, inner, wk, d, 1.f, dxkv, d); // dxkv += dk Wk
  c_.rounded(dxkv, int64_t(B) * tk * d);
  b.gemm(false, false, B * tk, d, inner, 1.f, dv, inner, wv, d, 1.f, dxkv, d); // dxkv += dv Wv
  c_.rounded(dxkv, int64_t(B) * tk * d);
  c_.tp_all_reduce(dxn, int64_t(B) * tq * d, Context::Flow::Backward, t.input_gradient_sum,
                   bool(injected_fault(Fault::TpSkipAttentionAllReduce)));
  c_.release_all(tmp);
}

void Attention::bias_forward(Micro& mb, int pi, CBuf W, const BlockTensors& t) {
  Backend& b = c_.b;
  const Piece& s = c_.pieces[size_t(pi)];
  const int stack = Context::stack_of(s), T = c_.seq(stack), H = c_.H;
  const int64_t table = c_.table_numel();
  if (s.layer == 0 && c_.fused()) {  // the stack's table, read by every block of the stack
    mb.bias[stack] = c_.act(mb, pi, table);
    b.copy(mb.bias[stack], t.rel_bias.in(W), table);
    if (stack_continues(stack)) mb.table[stack] = mb.bias[stack];
  } else if (s.layer == 0) {  // the stack's position bias, reused by every block of the stack
    mb.bias[stack] = c_.act(mb, pi, int64_t(H) * T * T);
    b.position_bias_forward(mb.bias[stack], t.rel_bias.in(W), buckets_[stack], H, T, T);
    if (stack_continues(stack)) {
      mb.table[stack] = c_.act(mb, pi, table);
      b.copy(mb.table[stack], t.rel_bias.in(W), table);
    }
  } else if (!c_.local(pi - 1)) {  // a pipeline stage's first block: the table it was sent
    if (c_.fused()) {
      mb.bias[stack] = mb.table[stack];
    } else {
      mb.bias[stack] = c_.act(mb, pi, int64_t(H) * T * T);
      b.position_bias_forward(mb.bias[stack], mb.table[stack], buckets_[stack], H, T, T);
    }
  }
}

// The stack's accumulators start at zero in its last block's backward, the first to add to
// them; a pipeline stage without that block receives them instead (unfused: the table's
// gradient in dtable, while dbias starts at zero in the stage's last block of the stack,
// and its first folds dbias into dtable).
void Attention::begin_bias_backward(int pi) {
  const Piece& s = c_.pieces[size_t(pi)];
  const int stack = Context::stack_of(s);
  if (s.layer == c_.L - 1) {
    c_.b.fill(dbias_[stack], 0.f, dbias_numel(stack));
    if (dtable_[stack]) c_.b.fill(dtable_[stack], 0.f, c_.table_numel());
  } else if (dtable_[stack] && c_.starts_stage(pi + 1)) {  // the later stages' sum is in dtable
    c_.b.fill(dbias_[stack], 0.f, dbias_numel(stack));
  }
}

void Attention::bias_backward(int pi, Buf G, const BlockTensors& t) {
  Backend& b = c_.b;
  const Piece& s = c_.pieces[size_t(pi)];
  const int stack = Context::stack_of(s), T = c_.seq(stack);
  if (s.layer == 0 && c_.fused()) {  // every block of the stack has added its d(table) by now
    b.add(t.rel_bias.in(G), dbias_[stack], c_.table_numel());
    c_.ready(t.rel_bias);
  } else if (dtable_[stack] && (s.layer == 0 || c_.starts_stage(pi))) {  // a stage's first block of the stack
    b.position_bias_backward(dtable_[stack], dbias_[stack], buckets_[stack], c_.H, T, T);
    if (s.layer == 0) {  // the whole stack's sum: into the table's gradient
      b.add(t.rel_bias.in(G), dtable_[stack], c_.table_numel());
      c_.ready(t.rel_bias);
    }  // else dtable crosses the cut before this block
  } else if (s.layer == 0) {  // every block of the stack has added its d(bias) by now
    b.position_bias_backward(t.rel_bias.in(G), dbias_[stack], buckets_[stack], c_.H, T, T);
    c_.ready(t.rel_bias);
  }
}

}  // namespace t5
}  // namespace sb
