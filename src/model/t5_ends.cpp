// The pieces around the stacks (t5_parts.h): the encoder embedding, the bridge (the
// encoder's final norm and the decoder embedding) and the head (the decoder's final norm,
// the LM head, softmax cross-entropy).
#include <cmath>
#include <vector>

#include "shardbench/core/check.h"
#include "t5_parts.h"

namespace sb {
namespace t5 {

EmbeddingTensors embedding_tensors(const std::vector<UnitSpec>& units, int u) {
  EmbeddingTensors t;
  t.shared = tensor_ref(units, u, "shared");
  return t;
}
BridgeTensors bridge_tensors(const std::vector<UnitSpec>& units, int u) {
  BridgeTensors t;
  t.final_norm = tensor_ref(units, u, "encoder.final_norm");
  return t;
}
HeadTensors head_tensors(const std::vector<UnitSpec>& units, int u, const ModelSpec& spec) {
  HeadTensors t;
  t.final_norm = tensor_ref(units, u, "decoder.final_norm");
  if (!spec.tie_embeddings) t.lm_head = tensor_ref(units, u, "lm_head");
  return t;
}

void Ends::resolve() {
  for (int pi = c_.part.first; pi < c_.part.last; ++pi) {
    const Piece& s = c_.pieces[size_t(pi)];
    if (s.kind == Piece::Bridge) bridge_ = bridge_tensors(c_.units, s.unit);
    if (s.kind == Piece::Head) head_ = head_tensors(c_.units, s.unit, c_.spec);
  }
}

float Ends::head_rescale() const { return c_.spec.tie_embeddings ? 1.f / std::sqrt(float(c_.d)) : 1.f; }

void Ends::embed_forward(Micro& mb, int pi, CBuf E) {
  const int Ne = c_.Ne, d = c_.d;
  mb.hidden[0][0] = c_.act(mb, pi, int64_t(Ne) * d);  // [Ne, d] = shared[enc_ids]
  c_.b.embedding_forward(mb.hidden[0][0], c_.embedding.shared.in(E), mb.enc_ids, Ne, d);
  // vocabulary-parallel: one rank holds each row
  c_.tp_all_reduce(mb.hidden[0][0], int64_t(Ne) * d, Context::Flow::Forward, "encoder embedding");
}
void Ends::embed_backward(Micro& mb, int pi, Buf GE) {
  c_.b.embedding_backward(c_.embedding.shared.in(GE), c_.d_hidden[0], mb.enc_ids, c_.Ne, c_.d);
  c_.shared_ready(pi);  // after the Head's and the Bridge's contributions, where this part runs them
}

void Ends::bridge_forward(Micro& mb, int pi, CBuf W, CBuf E) {
  Backend& b = c_.b;
  const int Ne = c_.Ne, Nd = c_.Nd, d = c_.d, L = c_.L;
  mb.enc_out = c_.act(mb, pi, int64_t(Ne) * d);  // [Ne, d] encoder final norm
  mb.bridge_rstd = c_.alloc_f32(mb.saved[size_t(pi)], Ne, MemCategory::Activations);
  b.rmsnorm_forward(mb.enc_out, mb.bridge_rstd, mb.hidden[0][size_t(L)], bridge_.final_norm.in(W), Ne, d, kNormEps);
  mb.hidden[1][0] = c_.act(mb, pi, int64_t(Nd) * d);  // [Nd, d] = shared[dec_ids]
  b.embedding_forward(mb.hidden[1][0], c_.embedding.shared.in(E), mb.dec_ids, Nd, d);
  c_.tp_all_reduce(mb.hidden[1][0], int64_t(Nd) * d, Context::Flow::Forward, "decoder embedding");
}
void Ends::bridge_backward(Micro& mb, int pi, CBuf W, Buf G, Buf GE) {
  Backend& b = c_.b;
  const int Ne = c_.Ne, d = c_.d;
  b.embedding_backward(c_.embedding.shared.in(GE), c_.d_hidden[1], mb.dec_ids, c_.Nd, d);
  c_.shared_ready(pi);
  b.fill(c_.d_hidden[0], 0.f, int64_t(Ne) * d);
  // every decoder block's cross K/V part, summed once
  c_.tp_all_reduce(c_.d_enc_out, int64_t(Ne) * d, Context::Flow::Backward,
                   "encoder output gradient (the cross-attention K/V's)");
  b.rmsnorm_backward(c_.d_hidden[0], bridge_.final_norm.in(G), c_.d_enc_out, mb.hidden[0][size_t(c_.L)],
                     bridge_.final_norm.in(W), mb.bridge_rstd, Ne, d);
  c_.ready(bridge_.final_norm);
}

// logits = (hn · d^-0.5) shared^T (HF's rescale before a tied LM head), folded into alpha;
// untied: logits = hn lm_head^T (T5ForConditionalGeneration rescales only a tied head).
void Ends::head_forward(Micro& mb, int pi, CBuf W, CBuf E) {
  Backend& b = c_.b;
  const int Nd = c_.Nd, d = c_.d, V = c_.V;
  const float rescale = head_rescale();
  mb.head_hn = c_.act(mb, pi, int64_t(Nd) * d);  // [Nd, d]
  mb.head_rstd = c_.alloc_f32(mb.saved[size_t(pi)], Nd, MemCategory::Activations);
  mb.logits = c_.act(mb, pi, int64_t(Nd) * V);   // [Nd, V]
  b.rmsnorm_forward(mb.head_hn, mb.head_rstd, mb.hidden[1][size_t(c_.L)], head_.final_norm.in(W), Nd, d, kNormEps);
  b.gemm(false, true, Nd, V, d, rescale, mb.head_hn, d, head_weight(W, E), d, 0.f, mb.logits, V);
  if (!c_.group_sums()) return b.cross_entropy(mb.logits, mb.losses, mb.labels, Nd, V, c_.grad_scale);  // logits := dlogits
  // Megatron-LM's parallel cross-entropy: the rows' max and Σexp (with the label's logit)
  // all-reduced over the group; nobody gathers the logits.
  std::vector<void*> tmp;
  float* row_max = c_.alloc_f32(tmp, Nd, MemCategory::Workspace);
  float* sums = c_.alloc_f32(tmp, 2 * int64_t(Nd), MemCategory::Workspace);
  b.cross_entropy_max(mb.logits, row_max, Nd, V);
  c_.tp_all_reduce(row_max, Nd, Context::Flow::Forward, "cross-entropy row maxima", false, ReduceOp::Max);
  b.cross_entropy_sums(mb.logits, row_max, mb.labels, sums, Nd, V);
  c_.rounded(sums, 2 * int64_t(Nd));
  c_.tp_all_reduce(sums, 2 * int64_t(Nd), Context::Flow::Forward, "cross-entropy sums (Σexp; the label's logit)");
  b.cross_entropy_finish(mb.logits, mb.losses, row_max, sums, mb.labels, Nd, V, c_.grad_scale);  // logits := dlogits
  c_.release_all(tmp);
}
void Ends::head_backward(Micro& mb, int pi, CBuf W, Buf G, CBuf E, Buf GE) {
  Backend& b = c_.b;
  const int Nd = c_.Nd, d = c_.d, V = c_.V;
  const float rescale = head_rescale();
  const bool tied = c_.spec.tie_embeddings;
  std::vector<void*> tmp;
  const Buf dhn = c_.alloc(tmp, int64_t(Nd) * d, MemCategory::Workspace);  // [Nd, d]
  // dhead += r · dlogits^T hn [V, d];  dhn = r · dlogits head [Nd, d]  (head: shared or lm_head)
  const Buf dhead = tied ? c_.embedding.shared.in(GE) : head_.lm_head.in(G);
  b.gemm(true, false, V, d, Nd, rescale, mb.logits, V, mb.head_hn, d, 1.f, dhead, d);
  if (tied) c_.shared_ready(pi);  // here only on a stage without the other embedding pieces
  else c_.ready(head_.lm_head);
  b.gemm(false, false, Nd, d, V, rescale, mb.logits, V, head_weight(W, E), d, 0.f, dhn, d);
  c_.rounded(dhn, int64_t(Nd) * d);
  c_.tp_all_reduce(dhn, int64_t(Nd) * d, Context::Flow::Backward, "LM head input gradient");
  b.fill(c_.d_hidden[1], 0.f, int64_t(Nd) * d);
  b.rmsnorm_backward(c_.d_hidden[1], head_.final_norm.in(G), dhn, mb.hidden[1][size_t(c_.L)],
                     head_.final_norm.in(W), mb.head_rstd, Nd, d);
  c_.ready(head_.final_norm);
  c_.release_all(tmp);
}

}  // namespace t5
}  // namespace sb
