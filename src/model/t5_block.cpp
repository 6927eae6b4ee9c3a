// The encoder and decoder blocks (t5_parts.h): pre-norm residual sub-layers, self-attention,
// the decoder's cross-attention, and the feed-forward (ReLU or gated GELU).
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"
#include "t5_parts.h"

namespace sb {
namespace t5 {

namespace {
AttentionTensors attention_tensors(const std::vector<UnitSpec>& units, int u, bool cross) {
  const std::string p = cross ? "cross." : "self.";
  AttentionTensors t;
  t.q = tensor_ref(units, u, p + "q");
  t.k = tensor_ref(units, u, p + "k");
  t.v = tensor_ref(units, u, p + "v");
  t.o = tensor_ref(units, u, p + "o");
  t.output_sum = cross ? "cross-attention output" : "self-attention output";
  t.input_gradient_sum = cross ? "cross-attention input gradient" : "self-attention input gradient";
  return t;
}
}  // namespace

BlockTensors block_tensors(const std::vector<UnitSpec>& units, int u, int layer, int stack, const ModelSpec& spec) {
  BlockTensors t;
  if (layer == 0) t.rel_bias = tensor_ref(units, u, "rel_bias");
  t.ln_sa = tensor_ref(units, u, "ln1");
  t.self = attention_tensors(units, u, false);
  if (stack == 1) {
    t.ln_ca = tensor_ref(units, u, "ln2");
    t.cross = attention_tensors(units, u, true);
  }
  t.ln_ff = tensor_ref(units, u, stack == 1 ? "ln3" : "ln2");
  if (spec.ffn == FfnKind::GatedGelu) {
    t.wi_0 = tensor_ref(units, u, "wi_0");
    t.wi_1 = tensor_ref(units, u, "wi_1");
  } else {
    t.wi = tensor_ref(units, u, "wi");
  }
  t.wo = tensor_ref(units, u, "wo");
  return t;
}

void Blocks::resolve() {
  tensors_.assign(c_.pieces.size(), BlockTensors());
  for (int pi = c_.part.first; pi < c_.part.last; ++pi) {
    const Piece& s = c_.pieces[size_t(pi)];
    if (s.kind == Piece::EncoderBlock || s.kind == Piece::DecoderBlock)
      tensors_[size_t(pi)] = block_tensors(c_.units, s.unit, s.layer, Context::stack_of(s), c_.spec);
  }
}

BlockState Blocks::alloc_state(std::vector<void*>& o, MemCategory cat, int stack) {
  const int64_t N = int64_t(c_.B) * c_.seq(stack), d = c_.d, ff = c_.ff;
  BlockState st;
  st.self = attention_.alloc_state(o, cat, c_.seq(stack), c_.seq(stack));
  st.x1 = c_.alloc(o, N * d, cat);
  if (stack == 1) {
    st.cross = attention_.alloc_state(o, cat, c_.Td, c_.Te);
    st.x2 = c_.alloc(o, N * d, cat);
  }
  st.rstd_ff = c_.alloc_f32(o, N, cat);
  st.xn_ff = c_.alloc(o, N * d, cat);
  if (c_.gated()) {  // the gate's two inputs, read again by its backward
    st.u = c_.alloc(o, N * ff, cat);
    st.v = c_.alloc(o, N * ff, cat);
  }
  st.h = c_.alloc(o, N * ff, cat);
  return st;
}

// The block's forward from hidden[stack][layer] into out [N, d], saving into st.
// Pre-norm residual sub-layers: x1 = x + SelfAttn(ln1 x); [x2 = x1 + CrossAttn(ln2 x1,
// enc_out)]; out = r + wo relu(wi ln_ff r), r the last residual stream (gated GELU:
// out = r + wo (gelu_tanh(wi_0 ln_ff r) * wi_1 ln_ff r)).
void Blocks::compute(const Micro& mb, int pi, CBuf W, BlockState& st, Buf out) {
  Backend& b = c_.b;
  const Piece& s = c_.pieces[size_t(pi)];
  const BlockTensors& t = tensors_[size_t(pi)];
  const int stack = Context::stack_of(s), T = c_.seq(stack), N = c_.B * T, d = c_.d, ff = c_.ff;
  const CBuf x = mb.hidden[stack][size_t(s.layer)];
  b.rmsnorm_forward_residual(st.self.xn, st.self.rstd, st.x1, x, t.ln_sa.in(W), N, d, kNormEps);
  attention_.forward(mb, W, t.self, st.self, st.self.xn, T, T, stack, /*causal=*/stack == 1, st.x1);
  CBuf r = st.x1;
  if (stack == 1) {
    b.rmsnorm_forward_residual(st.cross.xn, st.cross.rstd, st.x2, st.x1, t.ln_ca.in(W), N, d, kNormEps);
    attention_.forward(mb, W, t.cross, st.cross, mb.enc_out, c_.Td, c_.Te, /*bias_stack=*/-1, false, st.x2);
    r = st.x2;
  }
  b.rmsnorm_forward_residual(st.xn_ff, st.rstd_ff, out, r, t.ln_ff.in(W), N, d, kNormEps);  // out = r
  if (c_.gated()) {
    b.gemm(false, true, N, ff, d, 1.f, st.xn_ff, d, t.wi_0.in(W), d, 0.f, st.u, ff);  // u [N, ff]
    b.gemm(false, true, N, ff, d, 1.f, st.xn_ff, d, t.wi_1.in(W), d, 0.f, st.v, ff);  // v [N, ff]
    b.gated_gelu_forward(st.h, st.u, st.v, int64_t(N) * ff);
  } else {
    b.gemm_relu(false, true, N, ff, d, 1.f, st.xn_ff, d, t.wi.in(W), d, 0.f, st.h, ff);  // h [N, ff]
  }
  c_.add_row_parallel(out, int64_t(N) * d, "feed-forward output", [&](Buf dst, float beta) {  // out += h Wo^T
    b.gemm(false, true, N, d, ff, 1.f, st.h, ff, t.wo.in(W), ff, beta, dst, d);
  }, bool(injected_fault(Fault::TpSkipFeedForwardAllReduce)));
}

// d_hidden[stack] holds d(out) on entry and d(x) on exit. The stack's accumulators
// (the position bias's, and d_enc_out in the decoder) start at zero in its last block's
// backward, the first to add to them (Attention::begin_bias_backward).
void Blocks::backward_from(const Micro& mb, int pi, CBuf W, Buf G, const BlockState& st) {
  Backend& b = c_.b;
  const Piece& s = c_.pieces[size_t(pi)];
  const BlockTensors& t = tensors_[size_t(pi)];
  const int stack = Context::stack_of(s), T = c_.seq(stack), N = c_.B * T, d = c_.d, ff = c_.ff;
  const CBuf x = mb.hidden[stack][size_t(s.layer)];
  const Buf dy = c_.d_hidden[stack];  // [N, d], the residual stream's gradient
  attention_.begin_bias_backward(pi);
  if (s.layer == c_.L - 1 && stack == 1) b.fill(c_.d_enc_out, 0.f, int64_t(c_.Ne) * d);
  std::vector<void*> tmp;
  const Buf dxn = c_.alloc(tmp, int64_t(N) * d, MemCategory::Workspace);  // [N, d] d(normed input)

  // FFN: out = r + h Wo^T, h = relu(xn_ff Wi^T) or gelu_tanh(xn_ff Wi_0^T) * xn_ff Wi_1^T
  {
    const CBuf r = stack == 1 ? st.x2 : st.x1;
    std::vector<void*> tff;
    const Buf dh = c_.alloc(tff, int64_t(N) * ff, MemCategory::Workspace);  // [N, ff]
    b.gemm(true, false, d, ff, N, 1.f, dy, d, st.h, ff, 1.f, t.wo.in(G), ff);  // dWo += dy^T h
    c_.ready(t.wo);
    b.gemm(false, false, N, ff, d, 1.f, dy, d, t.wo.in(W), ff, 0.f, dh, ff);  // dh = dy Wo
    if (c_.gated()) {  // du (in dh's place) and dv; wi_1's gradient first, as the flat buffer reversed
      const Buf du = dh, dv = c_.alloc(tff, int64_t(N) * ff, MemCategory::Workspace);
      b.gated_gelu_backward(du, dv, dh, st.u, st.v, int64_t(N) * ff);
      b.gemm(true, false, ff, d, N, 1.f, dv, ff, st.xn_ff, d, 1.f, t.wi_1.in(G), d);  // dWi_1 += dv^T xn
      c_.ready(t.wi_1);
      b.gemm(true, false, ff, d, N, 1.f, du, ff, st.xn_ff, d, 1.f, t.wi_0.in(G), d);  // dWi_0 += du^T xn
      c_.ready(t.wi_0);
      b.gemm(false, false, N, d, ff, 1.f, du, ff, t.wi_0.in(W), d, 0.f, dxn, d);     // dxn = du Wi_0
      c_.rounded(dxn, int64_t(N) * d);
      b.gemm(false, false, N, d, ff, 1.f, dv, ff, t.wi_1.in(W), d, 1.f, dxn, d);     // dxn += dv Wi_1
      c_.rounded(dxn, int64_t(N) * d);
    } else {
      b.relu_backward(dh, st.h, int64_t(N) * ff);
      b.gemm(true, false, ff, d, N, 1.f, dh, ff, st.xn_ff, d, 1.f, t.wi.in(G), d);  // dWi += dh^T xn
      c_.ready(t.wi);
      b.gemm(false, false, N, d, ff, 1.f, dh, ff, t.wi.in(W), d, 0.f, dxn, d);     // dxn = dh Wi
      c_.rounded(dxn, int64_t(N) * d);
    }
    c_.tp_all_reduce(dxn, int64_t(N) * d, Context::Flow::Backward, "feed-forward input gradient");
    b.rmsnorm_backward(dy, t.ln_ff.in(G), dxn, r, t.ln_ff.in(W), st.rstd_ff, N, d);
    c_.ready(t.ln_ff);
    c_.release_all(tff);
  }
  if (stack == 1) {  // cross-attention: K/V gradients flow to the encoder output
    attention_.backward(mb, W, G, t.cross, st.cross, mb.enc_out, c_.Td, c_.Te, dy, dxn, c_.d_enc_out, -1, false);
    b.rmsnorm_backward(dy, t.ln_ca.in(G), dxn, st.x1, t.ln_ca.in(W), st.cross.rstd, N, d);
    c_.ready(t.ln_ca);
  }
  attention_.backward(mb, W, G, t.self, st.self, st.self.xn, T, T, dy, dxn, dxn, stack, stack == 1);
  b.rmsnorm_backward(dy, t.ln_sa.in(G), dxn, x, t.ln_sa.in(W), st.self.rstd, N, d);
  c_.ready(t.ln_sa);
  attention_.bias_backward(pi, G, t);
  c_.release_all(tmp);
}

void Blocks::forward(Micro& mb, int pi, CBuf W) {
  const Piece& s = c_.pieces[size_t(pi)];
  const int stack = Context::stack_of(s), T = c_.seq(stack);
  const Buf out = c_.act(mb, pi, int64_t(c_.B) * T * c_.d);  // [N, d], the next block's input
  attention_.bias_forward(mb, pi, W, tensors_[size_t(pi)]);
  if (c_.checkpointing) {  // keep only the input (owned by the previous piece) and the output
    std::vector<void*> tmp;
    BlockState st = alloc_state(tmp, MemCategory::Workspace, stack);
    compute(mb, pi, W, st, out);
    c_.release_all(tmp);
  } else {
    BlockState& st = mb.block_state[size_t(pi - c_.part.first)];
    st = alloc_state(mb.saved[size_t(pi)], MemCategory::Activations, stack);
    compute(mb, pi, W, st, out);
  }
  mb.hidden[stack][size_t(s.layer + 1)] = out;
}

void Blocks::backward(Micro& mb, int pi, CBuf W, Buf G) {
  const Piece& s = c_.pieces[size_t(pi)];
  const int stack = Context::stack_of(s);
  BlockState& st = mb.block_state[size_t(pi - c_.part.first)];
  if (c_.checkpointing) {  // recompute into the (identical) output still held by this piece
    st = alloc_state(mb.saved[size_t(pi)], MemCategory::Activations, stack);
    compute(mb, pi, W, st, mb.hidden[stack][size_t(s.layer + 1)]);
  }
  backward_from(mb, pi, W, G, st);
}

}  // namespace t5
}  // namespace sb
